"""The audio bytes of the main job, one home for both front ends: ``omni-backends run``'s ``out.wav`` and the
server's WAV / PCM bodies come from :func:`pcm16` and :func:`wav_bytes`, so a served WAV equals ``run``'s
``out.wav`` byte for byte for the same text, voice and seed.

Light: imports neither vLLM nor torch (``pcm16`` takes a tensor and uses its ``numpy()``).
"""

from __future__ import annotations

import io
import wave
from typing import Any

#: bytes per sample of :func:`pcm16` (mono 16-bit)
SAMPLE_WIDTH = 2


def pcm16(samples: Any) -> bytes:
    """Mono float samples -> 16-bit little-endian PCM bytes.

    ``samples``: a float ``torch.Tensor`` (any shape, read flattened, on the CPU) or anything ``numpy.asarray``
    takes, in [-1, 1] (values outside are clipped). Each sample is ``round(clip(x, -1, 1) * 32767)`` as
    ``<i2`` (numpy's round-half-to-even): ``2 * n`` bytes for ``n`` samples. Chunks convert independently
    (no state), so the PCM of concatenated chunks equals the concatenation of their PCM.
    """
    import numpy as np

    arr = samples.detach().cpu().numpy() if hasattr(samples, "detach") else np.asarray(samples)
    arr = np.asarray(arr, dtype=np.float32).reshape(-1)
    return (np.clip(arr, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


def wav_bytes(pcm: bytes, sample_rate: int) -> bytes:
    """A mono 16-bit PCM WAV file (RIFF header of 44 bytes, then ``pcm``) at ``sample_rate`` Hz, from
    :func:`pcm16`'s bytes (Python's ``wave`` module writes it). Raises ``ValueError`` for an odd number of
    bytes or a sample rate that is not a positive integer."""
    if len(pcm) % SAMPLE_WIDTH:
        raise ValueError(f"16-bit PCM must have an even number of bytes, got {len(pcm)}")
    if not isinstance(sample_rate, int) or isinstance(sample_rate, bool) or sample_rate <= 0:
        raise ValueError(f"sample_rate must be a positive integer (Hz), got {sample_rate!r}")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(SAMPLE_WIDTH)
        w.setframerate(sample_rate)
        w.writeframes(pcm)
    return buf.getvalue()


#: the RIFF and data sizes of a WAV streamed before its length is known (what WAV readers of a stream accept)
UNKNOWN_SIZE = 0xFFFFFFFF


def streaming_wav_header(sample_rate: int) -> bytes:
    """The 44-byte header of a mono 16-bit PCM WAV streamed before its length is known: the RIFF and ``data``
    chunk sizes are :data:`UNKNOWN_SIZE` (as vLLM-Omni's raw WAV streaming sends them); the PCM of :func:`pcm16`
    follows. Raises ``ValueError`` for a sample rate that is not a positive integer."""
    import struct

    if not isinstance(sample_rate, int) or isinstance(sample_rate, bool) or sample_rate <= 0:
        raise ValueError(f"sample_rate must be a positive integer (Hz), got {sample_rate!r}")
    return (b"RIFF" + struct.pack("<I", UNKNOWN_SIZE) + b"WAVEfmt "
            + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * SAMPLE_WIDTH, SAMPLE_WIDTH, 16)
            + b"data" + struct.pack("<I", UNKNOWN_SIZE))
