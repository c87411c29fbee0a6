"""Patch: the engine-core client's msgpack decoder -- its inner decoder decodes the omni output type.

- What: :func:`decode_as` replaces ``client.decoder.decoder`` (the ``msgspec.msgpack.Decoder`` inside vLLM's
  ``MsgpackDecoder`` of a multiprocess ``EngineCoreClient``) with one for ``core.engine.OmniEngineCoreOutputs``,
  keeping vLLM's ``ext_hook`` / ``dec_hook``; the ``MsgpackDecoder`` object itself is kept, so an output task
  that already holds it (``AsyncMPClient`` started in a running loop) decodes the omni type too.
- Why: the engine core sends ``OmniEngineCoreOutputs`` (one appended field); vLLM's client decodes into its
  own type, which would drop the field, and builds the decoder in ``MPClient.__init__`` with no option.
- Versions: vLLM 0.26 through 0.33 (``vllm.v1.serial_utils.MsgpackDecoder`` with ``decoder``, ``ext_hook``,
  ``dec_hook``).
- Until: an engine-core output type option on the client (or vLLM-Omni's engine upstream).
"""

from __future__ import annotations

from typing import Any

from omni_backends.binding import Patch, VendorSymbol

_SERIAL = "vllm.v1.serial_utils"
DECODER_INNER = VendorSymbol(_SERIAL, "MsgpackDecoder.decoder", kind="attribute")
DECODER_EXT_HOOK = VendorSymbol(_SERIAL, "MsgpackDecoder.ext_hook", kind="attribute")
DECODER_DEC_HOOK = VendorSymbol(_SERIAL, "MsgpackDecoder.dec_hook", kind="attribute")
#: the client builds its decoder in ``__init__`` and decodes every output with it
CLIENT_DECODER = VendorSymbol("vllm.v1.engine.core_client", "MPClient.__init__", mentions=("self.decoder =",))

PATCH = Patch.declare(__name__, __doc__, (DECODER_INNER, DECODER_EXT_HOOK, DECODER_DEC_HOOK, CLIENT_DECODER))


def decode_as(client: Any, outputs_type: type) -> None:
    """Make ``client``'s decoder (a multiprocess client's; an in-process client has none: nothing done)
    decode ``outputs_type``. Raises ``RuntimeError`` if the decoder lacks the fields this patch replaces."""
    import msgspec

    decoder = getattr(client, "decoder", None)
    if decoder is None:
        return
    inner = getattr(decoder, DECODER_INNER.attr_name, None)
    if inner is None or not hasattr(decoder, DECODER_EXT_HOOK.attr_name):
        raise RuntimeError("vLLM's engine-core client decoder has an unexpected shape; this vLLM is not supported")
    decoder.decoder = msgspec.msgpack.Decoder(outputs_type, ext_hook=decoder.ext_hook, dec_hook=decoder.dec_hook)
