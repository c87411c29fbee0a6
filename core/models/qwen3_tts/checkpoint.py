"""Read and check a Qwen3-TTS checkpoint in the released layout before any engine starts.

:func:`read_checkpoint` checks every file of the release (:mod:`.layout`) and what the core can run of its
config, and returns a :class:`Qwen3TTSCheckpoint`. Any problem is one
:class:`~omni_backends.errors.BadInputError` naming the file or the value and what is supported. The weights are
checked without loading them: each safetensors header is parsed (``safetensors.safe_open``, which refuses a
truncated file) and the tensors the talker's config implies are looked up by name and shape
(:func:`core.models.qwen3_tts.checkpoint_writer.talker_specs`, the same list the writer draws). Imports neither
torch nor vLLM at import time.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from core.models.qwen3_tts.layout import (
    MODEL_TYPE, ROOT_FILES, SAMPLE_RATE, SPEECH_TOKENIZER_DIR, SPEECH_TOKENIZER_FILES, SPEECH_TOKENIZER_MODEL_TYPE,
    TALKER_KEYS, TASK_TYPES, TOKENIZER_TYPE_12HZ, WEIGHTS_FILE, WEIGHTS_INDEX,
)
from omni_backends.errors import BadInputError

#: dtypes the talker can load in (``torch_dtype`` of config.json)
DTYPES = ("bfloat16", "float16", "float32")


@dataclasses.dataclass(frozen=True)
class Qwen3TTSCheckpoint:
    """A checked Qwen3-TTS checkpoint (:func:`read_checkpoint`).

    - ``path``: absolute directory; ``name``: its basename (the default served model name);
    - ``config``: root ``config.json`` as read (a dict, verbatim);
    - ``tts_model_type``: ``custom_voice`` | ``voice_design`` | ``base``; ``task_types``: the ``task_type``
      values it serves, vLLM-Omni's spelling (``("CustomVoice",)`` ...);
    - ``speakers``: ``talker_config.spk_id`` names as spelled there (empty for VoiceDesign / Base);
      ``languages``: ``"Auto"`` then the ``codec_language_id`` names;
    - ``sample_rate``: Hz of the decoder's output (24000); ``num_code_groups``: codebooks per frame ``Q``;
      ``samples_per_frame``: decoder samples per codec frame (1920); ``decoder_window``: the decoder's
      attention window in frames (72 released: the left context a streamed chunk needs);
    - ``talker_dtype``: ``torch_dtype`` of config.json; ``speech_tokenizer_dtype``: the dtype of the speech
      tokenizer's weights (float32 released);
    - ``base_unsupported_reason``: ``None`` where Base voice cloning runs here, else why not (the message a
      Base request gets).
    """

    path: str
    name: str
    config: dict
    tts_model_type: str
    task_types: tuple[str, ...]
    speakers: tuple[str, ...]
    languages: tuple[str, ...]
    sample_rate: int
    num_code_groups: int
    samples_per_frame: int
    decoder_window: int
    talker_dtype: str
    speech_tokenizer_dtype: str
    base_unsupported_reason: str | None

    @property
    def talker_config(self) -> dict:
        """``config["talker_config"]``."""
        return self.config["talker_config"]


def _bad(where: str, what: str) -> BadInputError:
    return BadInputError(f"Qwen3-TTS checkpoint: {where}: {what}")


def _read_json(root: str, rel: str) -> Any:
    path = os.path.join(root, rel)
    if not os.path.isfile(path):
        raise _bad(path, "missing (a released Qwen3-TTS checkpoint has it; download the whole repository)")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise _bad(path, f"unreadable JSON ({exc})") from None


def _require(cfg: dict, keys: tuple[str, ...], where: str) -> None:
    missing = [k for k in keys if k not in cfg]
    if missing:
        raise _bad(where, f"missing key(s) {', '.join(missing)} (the released config has them)")


def _weights_files(root: str) -> list[str]:
    """The talker's weight files: ``model.safetensors``, or the shards a ``model.safetensors.index.json`` names."""
    single, index = os.path.join(root, WEIGHTS_FILE), os.path.join(root, WEIGHTS_INDEX)
    if os.path.isfile(index):
        idx = _read_json(root, WEIGHTS_INDEX)
        wmap = idx.get("weight_map") if isinstance(idx, dict) else None
        if not isinstance(wmap, dict) or not wmap:
            raise _bad(index, "no weight_map (a shard index maps each tensor name to its file)")
        return sorted({os.path.join(root, f) for f in wmap.values()})
    if os.path.isfile(single):
        return [single]
    raise _bad(root, f"no talker weights: neither {WEIGHTS_FILE} nor {WEIGHTS_INDEX} (with its shards)")


def _tensor_shapes(files: list[str]) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
    """``{name: shape}`` and ``{name: dtype}`` of every tensor in ``files`` (headers only); one error naming a
    missing, truncated or unreadable file."""
    from safetensors import safe_open

    shapes, dtypes = {}, {}
    for path in files:
        if not os.path.isfile(path):
            raise _bad(path, "missing (the checkpoint needs it; download the whole repository)")
        size = os.path.getsize(path)
        try:
            with open(path, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(n)) if 0 < n <= size - 8 else None
            if not isinstance(header, dict):
                raise ValueError("the safetensors header is cut off")
            end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
            if 8 + n + end > size:
                raise ValueError(f"the file is {size} bytes, its header describes {8 + n + end}")
            with safe_open(path, framework="pt") as f:
                for key in f.keys():
                    sl = f.get_slice(key)
                    shapes[key] = tuple(int(d) for d in sl.get_shape())
                    dtypes[key] = str(sl.get_dtype())
        except Exception as exc:  # noqa: BLE001 - any failure to read the file is the same input error
            raise _bad(path, f"unreadable or truncated safetensors file ({exc}); download it again") from None
    return shapes, dtypes


def _check_talker_weights(root: str, cfg: dict) -> None:
    """Every ``talker.*`` tensor the config implies is present with its shape."""
    from core.models.qwen3_tts.checkpoint_writer import talker_specs

    files = _weights_files(root)
    shapes, _ = _tensor_shapes(files)
    where = files[0] if len(files) == 1 else os.path.join(root, WEIGHTS_INDEX)
    for name, shape, _std, _base in talker_specs(cfg):
        if name not in shapes:
            raise _bad(where, f"tensor {name} missing (config.json's talker_config implies it)")
        if shapes[name] != tuple(shape):
            raise _bad(where, f"tensor {name} has shape {list(shapes[name])}, config.json's talker_config implies "
                              f"{list(shape)}")


def _check_speech_tokenizer(root: str, cfg: dict) -> tuple[int, int, str]:
    """(samples per frame, decoder window, weights dtype) of ``speech_tokenizer/``."""
    st = os.path.join(root, SPEECH_TOKENIZER_DIR)
    tok = _read_json(root, f"{SPEECH_TOKENIZER_DIR}/config.json")
    for name in SPEECH_TOKENIZER_FILES[1:3]:
        _read_json(root, f"{SPEECH_TOKENIZER_DIR}/{name}")
    where = os.path.join(st, "config.json")
    if not isinstance(tok, dict) or tok.get("model_type") != SPEECH_TOKENIZER_MODEL_TYPE:
        got = tok.get("model_type") if isinstance(tok, dict) else tok
        raise _bad(where, f"model_type {got!r} is not supported; the core runs the 12 Hz speech tokenizer "
                          f"({SPEECH_TOKENIZER_MODEL_TYPE!r})")
    _require(tok, ("decoder_config", "decode_upsample_rate", "output_sample_rate"), where)
    dec = tok["decoder_config"]
    if int(tok["output_sample_rate"]) != SAMPLE_RATE:
        raise _bad(where, f"output_sample_rate {tok['output_sample_rate']} is not supported; the 12 Hz decoder "
                          f"gives {SAMPLE_RATE} Hz")
    q = int(cfg["talker_config"]["num_code_groups"])
    if int(dec.get("num_quantizers", q)) != q:
        raise _bad(where, f"decoder_config.num_quantizers {dec.get('num_quantizers')} differs from config.json's "
                          f"talker_config.num_code_groups {q}")
    shapes, dtypes = _tensor_shapes([os.path.join(st, "model.safetensors")])
    if not any(k.startswith("decoder.") for k in shapes):
        raise _bad(os.path.join(st, "model.safetensors"), "no decoder.* tensors (the 12 Hz speech tokenizer's "
                                                          "decoder turns codec frames into sound)")
    dtype = next((v for k, v in dtypes.items() if k.startswith("decoder.")), "")
    return int(tok["decode_upsample_rate"]), int(dec.get("sliding_window", 72)), dtype


def base_unsupported_reason() -> str | None:
    """Why Base voice cloning (``ref_audio``) cannot run in this process, or ``None``: vLLM-Omni's talker
    computes the reference audio's mel features with ``torchaudio.functional.melscale_fbanks``
    (``vllm_omni/utils/audio.py``), and the cpu stack has no torchaudio build for its torch."""
    import importlib.util

    if importlib.util.find_spec("torchaudio") is None:
        return ("Base (voice clone from ref_audio) needs torchaudio, which vLLM-Omni's talker uses for the reference "
                "audio's mel features, and it is not installed here (no torchaudio build exists for this torch); "
                "serve a CustomVoice or VoiceDesign checkpoint, or install a torchaudio matching your torch")
    return None


def read_checkpoint(model_dir: str) -> Qwen3TTSCheckpoint:
    """Check the Qwen3-TTS checkpoint in ``model_dir`` (a local directory in the released layout) and describe it.

    Checked, in order: the directory; ``config.json`` (every released root key, ``model_type`` ``qwen3_tts``,
    ``tokenizer_type`` the 12 Hz one, ``tts_model_type`` one of :data:`~.layout.TASK_TYPES`' keys, the talker's
    released keys, ``torch_dtype``); ``generation_config.json``, ``preprocessor_config.json``,
    ``tokenizer_config.json`` (JSON); ``vocab.json`` (JSON) and ``merges.txt`` (present, readable); the talker
    weights (one file or shards + index; every tensor the talker config implies, by name and shape; no
    truncated file); ``speech_tokenizer/`` (its three JSON files, the 12 Hz ``model_type``, 24 kHz, its
    quantizers = ``num_code_groups``, decoder weights present). Nothing is loaded onto a device.

    Raises :class:`~omni_backends.errors.BadInputError` naming the file or value and what is supported.
    """
    root = os.path.abspath(os.path.expanduser(str(model_dir)))
    if not os.path.isdir(root):
        raise _bad(root, "not a directory (give the local folder of a Qwen3-TTS checkpoint)")
    cfg = _read_json(root, "config.json")
    where = os.path.join(root, "config.json")
    if not isinstance(cfg, dict):
        raise _bad(where, "not a JSON object")
    if cfg.get("model_type") != MODEL_TYPE:
        raise _bad(where, f"model_type {cfg.get('model_type')!r} is not supported; this serves Qwen3-TTS "
                          f"checkpoints (model_type {MODEL_TYPE!r})")
    if cfg.get("tokenizer_type") != TOKENIZER_TYPE_12HZ:
        raise _bad(where, f"tokenizer_type {cfg.get('tokenizer_type')!r} is not supported; vLLM-Omni 0.30's "
                          f"Qwen3-TTS stages run the 12 Hz speech tokenizer ({TOKENIZER_TYPE_12HZ!r}) only")
    tts_type = cfg.get("tts_model_type")
    if tts_type not in TASK_TYPES:
        raise _bad(where, f"tts_model_type {tts_type!r} is not supported; one of {', '.join(TASK_TYPES)}")
    from core.models.qwen3_tts.layout import ROOT_KEYS

    _require(cfg, ROOT_KEYS, where)
    talker = cfg["talker_config"]
    if not isinstance(talker, dict):
        raise _bad(where, "talker_config is not an object")
    _require(talker, TALKER_KEYS, f"{where} talker_config")
    rope = talker.get("rope_scaling") or {}
    if not isinstance(rope, dict) or "mrope_section" not in rope:
        raise _bad(where, f"talker_config.rope_scaling {rope!r} has no mrope_section (the released talker uses "
                          "interleaved M-RoPE)")
    if sum(rope["mrope_section"]) * 2 != int(talker["head_dim"]):
        raise _bad(where, f"talker_config.rope_scaling.mrope_section {rope['mrope_section']} does not cover "
                          f"head_dim {talker['head_dim']} (its sum must be head_dim / 2)")
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    if dtype not in DTYPES:
        raise _bad(where, f"torch_dtype {dtype!r} is not supported; one of {', '.join(DTYPES)}")
    if tts_type == "custom_voice" and not talker["spk_id"]:
        raise _bad(where, "talker_config.spk_id is empty; a custom_voice checkpoint names its speakers there")
    for rel in ROOT_FILES[1:]:
        path = os.path.join(root, rel)
        if rel == "merges.txt":
            if not os.path.isfile(path):
                raise _bad(path, "missing (the released text tokenizer is vocab.json + merges.txt)")
            try:
                with open(path, encoding="utf-8") as f:
                    f.readline()
            except (OSError, UnicodeDecodeError) as exc:
                raise _bad(path, f"unreadable ({exc})") from None
        else:
            _read_json(root, rel)
    _check_talker_weights(root, cfg)
    samples_per_frame, window, st_dtype = _check_speech_tokenizer(root, cfg)
    name = os.path.basename(root.rstrip(os.sep)) or root
    return Qwen3TTSCheckpoint(
        path=root, name=name, config=cfg, tts_model_type=tts_type, task_types=(TASK_TYPES[tts_type],),
        speakers=tuple(talker["spk_id"]), languages=("Auto", *talker["codec_language_id"]),
        sample_rate=SAMPLE_RATE, num_code_groups=int(talker["num_code_groups"]),
        samples_per_frame=samples_per_frame, decoder_window=window, talker_dtype=dtype,
        speech_tokenizer_dtype=_torch_dtype_name(st_dtype),
        base_unsupported_reason=base_unsupported_reason() if tts_type == "base" else None,
    )


def _torch_dtype_name(safetensors_dtype: str) -> str:
    """``F32`` -> ``float32`` (safetensors' dtype names)."""
    return {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}.get(safetensors_dtype.upper(),
                                                                         safetensors_dtype.lower() or "float32")


__all__ = ["DTYPES", "Qwen3TTSCheckpoint", "base_unsupported_reason", "read_checkpoint"]
