"""vLLM-Omni's Qwen3-TTS speech request: checked against a checkpoint, then turned into the talker's prompt.

:class:`TTSRequest` holds the Qwen3-TTS fields of vLLM-Omni 0.30's ``OpenAICreateSpeechRequest``
(``entrypoints/openai/protocol/audio.py``), under its names. :func:`check_tts_request` applies the rules of
vLLM-Omni's ``Qwen3TTSAdapter.validate`` and :func:`talker_inputs` builds what its ``Qwen3TTSAdapter.build`` /
``_build_tts_params`` and ``serving_speech.py`` build: the per-request TTS parameters (each value a one-element
list), the placeholder prompt ``[1] * prompt_len`` whose length is vLLM-Omni's
``Qwen3TTSPromptEmbedsBuilder.estimate_prompt_len_from_additional_information`` with the checkpoint's
``codec_language_id`` and ``spk_is_dialect``, and the talker's ``SamplingParams`` (the deploy defaults, the
pipeline's stop token, ``max_new_tokens`` as the talker's ``max_tokens`` cap, the seed as ``seed`` and
``extra_args["tts_local_seed"]``).

Why the rules are restated here rather than called: vLLM-Omni's adapter module
(``entrypoints/openai/tts_adapters/qwen3_tts.py``) cannot be imported on the core's vLLM: its package imports
``vllm.entrypoints.chat_utils`` (through ``entrypoints/openai/protocol/audio.py`` and the adapter base), which
vLLM 0.32 moved to ``vllm.renderers.chat_utils``; and its methods read a running ``OmniOpenAIServingSpeech``
(``self.ctx.server``). The prompt length -- the part that must match the model's own prompt building bit for bit
-- goes through vLLM-Omni's ``prompt_embeds_builder`` module, which loads (:func:`core.models.vllm_omni.load_module`).
Uploaded / precomputed voices and ``speaker_embedding`` are not offered (the server has no voice store).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from omni_backends.errors import BadInputError

#: vLLM-Omni's Qwen3-TTS adapter bounds (``tts_adapters/base.py``: ``max_new_tokens_min`` / ``_max``)
MAX_NEW_TOKENS = (1, 4096)
#: additional-information key vLLM-Omni's adapter sets to the talker's effective token cap
EFFECTIVE_MAX_TOKENS_KEY = "_qwen3_tts_effective_max_tokens"


class TTSRequestError(BadInputError):
    """A speech request the checkpoint cannot serve; ``param`` names the request field (OpenAI's error ``param``)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclasses.dataclass(frozen=True)
class TTSRequest:
    """A Qwen3-TTS speech request, vLLM-Omni's field names.

    ``text`` (the API's ``input``), ``task_type`` (``CustomVoice`` | ``VoiceDesign`` | ``Base``; ``None``: Base
    when ``ref_audio`` / ``ref_text`` is given, else CustomVoice, as vLLM-Omni infers it), ``speaker`` (the API's
    ``voice``), ``language`` (``Auto`` or a ``codec_language_id`` name, any case), ``instructions``, ``seed``
    (int), ``max_new_tokens`` (1..4096: the talker's token cap), ``ref_audio``, ``ref_text``,
    ``x_vector_only_mode``, ``non_streaming_mode`` (bool; ``None``: the model's default)."""

    text: str
    task_type: str | None = None
    speaker: str | None = None
    language: str | None = None
    instructions: str | None = None
    seed: int | None = None
    max_new_tokens: int | None = None
    ref_audio: Any = None
    ref_text: str | None = None
    x_vector_only_mode: bool | None = None
    non_streaming_mode: bool | None = None


def check_tts_request(ckpt: Any, req: TTSRequest, *, max_instructions_length: int = 500) -> TTSRequest:
    """``req`` checked against ``ckpt`` (a :class:`~.checkpoint.Qwen3TTSCheckpoint`) and normalised as vLLM-Omni
    normalises it: ``task_type`` resolved, ``speaker`` lower-cased (CustomVoice without one: the checkpoint's first
    speaker), ``language`` title-cased (default ``Auto``). Rules (vLLM-Omni's ``Qwen3TTSAdapter.validate``): the
    task type is the one the checkpoint serves; the text is not empty; the language is ``Auto`` or one of the
    checkpoint's; a CustomVoice speaker is one of the checkpoint's; Base needs ``ref_audio`` (and ``ref_text``
    unless ``x_vector_only_mode``) and must run here (``ckpt.base_unsupported_reason``); ``ref_text`` /
    ``x_vector_only_mode`` only with Base; VoiceDesign needs ``instructions``; instructions at most
    ``max_instructions_length`` characters (the pipeline's ``tts_args``); ``max_new_tokens`` in 1..4096;
    ``seed`` an integer. Raises :class:`TTSRequestError` whose ``param`` names the field."""
    if not isinstance(req.text, str) or not req.text.strip():
        raise TTSRequestError("input text cannot be empty", "input")
    task = req.task_type
    if task is None:
        task = "Base" if (req.ref_audio is not None or req.ref_text is not None) else "CustomVoice"
    if task not in ckpt.task_types:
        served = ckpt.task_types[0]
        raise TTSRequestError(f"this Qwen3-TTS {served} checkpoint ({ckpt.name}) does not support task_type="
                              f"{task!r}; use task_type={served!r} or serve a {task} checkpoint", "task_type")
    language = "Auto" if req.language is None else str(req.language).title()
    languages = {lang.title() for lang in ckpt.languages}
    if language not in languages:
        raise TTSRequestError(f"invalid language {req.language!r}; supported: {', '.join(sorted(languages))}",
                              "language")
    speaker = None if req.speaker is None else str(req.speaker).lower()
    if task == "CustomVoice":
        if speaker is None:
            speaker = ckpt.speakers[0] if ckpt.speakers else None
        if speaker not in {s.lower() for s in ckpt.speakers}:
            raise TTSRequestError(f"invalid voice {req.speaker!r}; this checkpoint's speakers: "
                                  f"{', '.join(sorted(ckpt.speakers))}", "voice")
    if task == "Base":
        if ckpt.base_unsupported_reason:
            raise TTSRequestError(ckpt.base_unsupported_reason, "task_type")
        if req.ref_audio is None:
            raise TTSRequestError("Base task requires 'ref_audio' for voice cloning", "ref_audio")
        if not req.x_vector_only_mode and not (req.ref_text or "").strip():
            raise TTSRequestError("Base task requires non-empty 'ref_text' (transcript of the reference audio) unless "
                                  "'x_vector_only_mode' is enabled", "ref_text")
    else:
        if req.ref_text is not None:
            raise TTSRequestError("'ref_text' is only valid for Base task", "ref_text")
        if req.x_vector_only_mode is not None:
            raise TTSRequestError("'x_vector_only_mode' is only valid for Base task", "x_vector_only_mode")
        if req.ref_audio is not None:
            raise TTSRequestError("'ref_audio' is only valid for Base task", "ref_audio")
    if task == "VoiceDesign" and not req.instructions:
        raise TTSRequestError("VoiceDesign task requires 'instructions' to describe the voice", "instructions")
    if req.instructions is not None and len(req.instructions) > max_instructions_length:
        raise TTSRequestError(f"instructions too long (max {max_instructions_length} characters)", "instructions")
    if req.max_new_tokens is not None:
        lo, hi = MAX_NEW_TOKENS
        if isinstance(req.max_new_tokens, bool) or not isinstance(req.max_new_tokens, int) \
                or not lo <= req.max_new_tokens <= hi:
            raise TTSRequestError(f"max_new_tokens must be an integer in {lo}..{hi}, got {req.max_new_tokens!r}",
                                  "max_new_tokens")
    if req.seed is not None and (isinstance(req.seed, bool) or not isinstance(req.seed, int) or req.seed < 0
                                 or req.seed >= 2**63):
        raise TTSRequestError(f"seed must be a non-negative integer, got {req.seed!r}", "seed")
    return dataclasses.replace(req, task_type=task, speaker=speaker, language=language)


def tts_params(req: TTSRequest) -> dict[str, list]:
    """The per-request TTS parameters of a checked request (:func:`check_tts_request`), as vLLM-Omni's
    ``Qwen3TTSAdapter._build_tts_params`` makes them: each value a one-element list; ``instruct`` ``""`` when
    absent, ``max_new_tokens`` 2048 when absent, ``non_streaming_mode`` True for VoiceDesign when absent."""
    params: dict[str, list] = {"text": [req.text], "task_type": [req.task_type], "language": [req.language]}
    if req.speaker is not None:
        params["speaker"] = [req.speaker]
    params["instruct"] = [req.instructions if req.instructions is not None else ""]
    if req.ref_text is not None:
        params["ref_text"] = [req.ref_text]
    if req.ref_audio is not None:
        params["ref_audio"] = [req.ref_audio]
    if req.x_vector_only_mode is not None:
        params["x_vector_only_mode"] = [req.x_vector_only_mode]
    params["max_new_tokens"] = [req.max_new_tokens if req.max_new_tokens is not None else 2048]
    if req.non_streaming_mode is not None:
        params["non_streaming_mode"] = [req.non_streaming_mode]
    elif req.task_type == "VoiceDesign":
        params["non_streaming_mode"] = [True]
    return params


def _is_decoded_audio(value: Any) -> bool:
    return (isinstance(value, (list, tuple)) and len(value) == 2 and isinstance(value[1], (int, float))
            and hasattr(value[0], "__len__") and len(value[0]) > 0 and value[1] > 0)


def _codec_frame_rate(ckpt: Any) -> float:
    """Codec frames per second as vLLM-Omni's adapter reads it (``Qwen3TTSConfig.codec_frame_rate_hz``:
    ``talker_config.position_id_per_seconds``)."""
    return float(ckpt.talker_config.get("position_id_per_seconds") or 12.5)


def _text_tokenizer(path: str) -> Any:
    """The checkpoint's text tokenizer as vLLM-Omni's speech server loads it (``AutoTokenizer``, left padding),
    one per checkpoint path."""
    tok = _TOKENIZERS.get(path)
    if tok is None:
        from transformers import AutoTokenizer

        tok = _TOKENIZERS[path] = AutoTokenizer.from_pretrained(path, trust_remote_code=True, padding_side="left")
    return tok


_TOKENIZERS: dict[str, Any] = {}


def prompt_len(ckpt: Any, params: dict[str, list]) -> int:
    """The talker's placeholder prompt length for ``params`` (:func:`tts_params`): vLLM-Omni's
    ``Qwen3TTSPromptEmbedsBuilder.estimate_prompt_len_from_additional_information`` with the checkpoint's text
    tokenizer, ``codec_language_id`` and ``spk_is_dialect`` (loaded bare, :mod:`core.models.vllm_omni`)."""
    from core.models.qwen3_tts import PACKAGE
    from core.models.vllm_omni import load_module

    builder = load_module(f"{PACKAGE}.prompt_embeds_builder").Qwen3TTSPromptEmbedsBuilder
    tok = _text_tokenizer(ckpt.path)
    talker = ckpt.talker_config
    return int(builder.estimate_prompt_len_from_additional_information(
        additional_information=params, task_type=params["task_type"][0],
        tokenize_prompt=lambda t: tok(t, padding=False)["input_ids"],
        codec_language_id=talker.get("codec_language_id"), spk_is_dialect=talker.get("spk_is_dialect"),
        estimate_ref_code_len=lambda item: math.ceil(len(item[0]) / int(item[1]) * _codec_frame_rate(ckpt))
        if _is_decoded_audio(item) else None))


def talker_inputs(ckpt: Any, deploy: Any, req: TTSRequest, *, output_kind: Any = None, check: bool = True,
                  **overrides: Any) -> tuple[dict, Any]:
    """``(prompt, sampling_params)`` of the talker for ``req`` on ``ckpt`` with ``deploy``
    (:func:`~.deploy.deploy_defaults`), as vLLM-Omni builds them.

    ``prompt``: ``{"prompt_token_ids": [1] * prompt_len}`` (:func:`prompt_len`). ``sampling_params``: a
    ``vllm.SamplingParams`` with the deploy's talker sampling (temperature, top_k, repetition_penalty,
    min_tokens, the pipeline's ``stop_token_ids``), ``max_tokens`` = ``req.max_new_tokens`` or the deploy's
    (``min_tokens`` clipped to it), ``detokenize`` False, ``seed`` = ``req.seed`` and, with a seed,
    ``extra_args["tts_local_seed"]`` (the code predictor's generator); the TTS parameters (:func:`tts_params`,
    plus vLLM-Omni's effective-cap key) ride in ``extra_args`` as the core's omni payload
    (:data:`core.payloads.EXTRA_ARGS_KEY`), which the runner hands the talker as its per-request state.
    ``output_kind``: a ``vllm.sampling_params.RequestOutputKind`` (default vLLM's). ``check``: run
    :func:`check_tts_request` first (raises :class:`TTSRequestError`). ``overrides``: ``SamplingParams`` fields
    that replace the deploy's (e.g. ``temperature=0.0`` for greedy codebook 0, ``ignore_eos=True`` for a fixed
    length). Imports vLLM."""
    from vllm.sampling_params import SamplingParams

    from core.payloads import EXTRA_ARGS_KEY, MTP_SEED_KEY, pack

    if check:
        req = check_tts_request(ckpt, req, max_instructions_length=deploy.max_instructions_length)
    if req.ref_audio is not None and not _is_decoded_audio(req.ref_audio):
        raise TTSRequestError("ref_audio must be decoded audio [samples, sample_rate] here; vLLM-Omni's server decodes "
                              "URL / base64 reference audio itself (serving_speech), which this server does not",
                              "ref_audio")
    params = tts_params(req)
    if req.ref_audio is not None:  # vLLM-Omni's adapter: the reference's codec length at the codec frame rate
        wav, sr = req.ref_audio
        params["ref_code_length"] = [math.ceil(len(wav) / int(sr) * _codec_frame_rate(ckpt))]
    sampling = dict(deploy.talker_sampling)
    cap = int(req.max_new_tokens if req.max_new_tokens is not None else sampling.get("max_tokens", MAX_NEW_TOKENS[1]))
    params[EFFECTIVE_MAX_TOKENS_KEY] = [cap]
    n = prompt_len(ckpt, params)
    extra: dict[str, Any] = {EXTRA_ARGS_KEY: pack(params)}
    if req.seed is not None:
        extra[MTP_SEED_KEY] = int(req.seed)
    kw = {k: sampling[k] for k in ("temperature", "top_k", "top_p", "repetition_penalty", "stop_token_ids")
          if k in sampling}
    kw.update(max_tokens=cap, min_tokens=min(int(sampling.get("min_tokens", 0) or 0), cap),
              detokenize=bool(sampling.get("detokenize", False)), seed=req.seed, extra_args=extra)
    if output_kind is not None:
        kw["output_kind"] = output_kind
    kw.update(overrides)
    return {"prompt_token_ids": [1] * n}, SamplingParams(**kw)


__all__ = ["EFFECTIVE_MAX_TOKENS_KEY", "MAX_NEW_TOKENS", "TTSRequest", "TTSRequestError",
           "check_tts_request", "prompt_len", "talker_inputs", "tts_params"]
