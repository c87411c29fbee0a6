"""What each Qwen3-TTS stage's engine takes and gives on the core: engine arguments, codec frames out of the
talker, code2wav's prompt and waveform.

- :func:`stage_engine_args`: the keyword arguments of ``core.stage.make_engine`` / ``make_async_engine`` for the
  ``talker`` or ``code2wav`` stage: the architecture vLLM-Omni's pipeline forces per stage (``hf_overrides``
  ``architectures``, as its ``OmniEngineArgs`` does over the released ``Qwen3TTSForConditionalGeneration``), the
  dtype (talker: the checkpoint's ``torch_dtype``; code2wav: the deploy's), the deploy's engine sizes.
- :func:`talker_frames`: the codec frames ``[n, Q]`` of a talker ``RequestOutput``, through vLLM-Omni's own
  producer ``talker2code2wav_full_payload`` (which drops the prompt's placeholder rows and invalid frames and crops
  to the generated length);
- :func:`code2wav_inputs` / :func:`code2wav_waveform`: a code2wav request for frames (codebook-major, as
  vLLM-Omni's producers flatten them) with ``left_context`` earlier frames for the decoder's window, and the
  waveform of the new frames only.
"""

from __future__ import annotations

from typing import Any

from omni_backends.errors import BadInputError

STAGES = ("talker", "code2wav")


def stage_engine_args(ckpt: Any, deploy: Any, stage: str, backend: Any = None, *, dtype: str | None = None,
                      max_num_seqs: int | None = None, max_model_len: int | None = None,
                      max_frames: int | None = None, window: Any = None, seed: int = 0) -> dict[str, Any]:
    """``make_engine`` keyword arguments (``model`` included) for ``stage`` (``"talker"`` | ``"code2wav"``) of
    ``ckpt`` under ``deploy``.

    Both: ``model`` = the checkpoint path, ``kind`` (``ar`` / ``generation``), ``hf_overrides`` =
    ``{"architectures": [deploy.model_arch[stage]]}``, ``dtype`` (``dtype`` argument, else talker: the
    checkpoint's ``torch_dtype``, code2wav: the deploy's), ``max_num_seqs`` (argument, else the deploy's),
    ``enable_prefix_caching`` False (the deploy's), ``skip_tokenizer_init`` True (the talker's prompt is
    placeholder ids; vLLM-Omni's talker loads the text tokenizer itself), ``seed``.
    Talker: ``max_model_len`` = argument, else the deploy's, at most ``max_position_embeddings``.
    Code2wav: a request carries ``Q * frames`` codes; ``max_frames`` (default: the streaming window, the deploy's
    ``left_context_frames + chunk_frames``) sets ``max_model_len = Q * max_frames + 1`` and
    ``max_num_batched_tokens = max_num_seqs * max_model_len`` (a code2wav request is one forward, never split);
    ``additional_config`` (:func:`code2wav_model_config`): what vLLM-Omni's ``OmniModelConfig`` gives the model
    (the deploy's connector config, ``async_chunk``), set on the stage's ``ModelConfig`` in its worker
    (:mod:`core.patches.model_config_fields`); ``window`` (a :class:`~core.pipeline.spec.ChunkWindow`, default
    the deploy's): the chunking it says.
    With ``backend``: the engine's memory sized for its model (``omni_backends.engine_memory.engine_memory_kw``).
    Not taken from the deploy: ``gpu_memory_utilization`` (sized per model instead, above), the talker's
    ``max_num_batched_tokens`` 512 (a latency setting that would split a long prompt into chunked prefill, which
    the core's talker path has not been run with), ``async_scheduling`` and ``enforce_eager`` (the driver's and
    the caller's choice), ``devices`` / connectors (the stage graph's).
    ``vllm-omni``'s ``subtalker_sampling_params`` is not an engine argument vLLM has; the talker's own defaults
    are the deploy's values (``deploy.subtalker_sampling``). Raises ``BadInputError`` for an unknown stage or a
    length beyond the model's positions."""
    if stage not in STAGES:
        raise BadInputError(f"unknown Qwen3-TTS stage {stage!r}; one of {', '.join(STAGES)}")
    from core.kinds import AR, GENERATION

    eng = dict(deploy.engine_args.get(stage, {}))
    seqs = int(max_num_seqs or eng.get("max_num_seqs", 1))
    kw: dict[str, Any] = {
        "model": ckpt.path, "kind": AR if stage == "talker" else GENERATION,
        "hf_overrides": {"architectures": [deploy.model_arch[stage]]},
        "max_num_seqs": seqs, "enable_prefix_caching": bool(eng.get("enable_prefix_caching", False)),
        "skip_tokenizer_init": True, "seed": int(seed),
    }
    if stage == "talker":
        kw["dtype"] = dtype or ckpt.talker_dtype
        limit = int(ckpt.talker_config["max_position_embeddings"])
        length = int(max_model_len or min(int(eng.get("max_model_len", limit)), limit))
        if length > limit:
            raise BadInputError(f"max_model_len {length} exceeds the talker's max_position_embeddings ({limit})")
        kw["max_model_len"] = length
    else:
        kw["dtype"] = dtype or str(eng.get("dtype", ckpt.speech_tokenizer_dtype))
        frames = int(max_frames or (deploy.left_context_frames + max(deploy.chunk_frames, deploy.initial_chunk_frames)))
        length = int(max_model_len or ckpt.num_code_groups * frames + 1)
        kw.update(max_model_len=length, max_num_batched_tokens=seqs * length,
                  additional_config=code2wav_model_config(deploy, window))
    if backend is not None:
        from omni_backends.engine_memory import engine_memory_kw

        kw.update(engine_memory_kw(backend, ckpt.path, max_model_len=kw["max_model_len"], max_num_seqs=seqs,
                                   dtype=kw["dtype"]))
    return kw


def code2wav_model_config(deploy: Any, window: Any = None) -> dict[str, Any]:
    """The engine argument ``additional_config`` of the code2wav stage: vLLM-Omni's ``OmniModelConfig`` fields as
    its ``OmniEngineArgs.create_model_config`` makes them for stage 1 under ``deploy``
    (:func:`core.patches.model_config_fields.additional_config`):

    - ``stage_connector_config``: ``{"name": ..., "extra": {...}}``, the deploy's talker -> code2wav connector
      (``deploy.connector``) with ``extra["stage_id"] = 1``; ``Qwen3TTSCode2Wav.load_weights`` reads its decode
      settings there (``decode_batch_max_size``, ``codec_chunk_frames``, ``codec_left_context_frames``,
      ``initial_codec_chunk_frames``, and ``decode_chunk_frames`` / ``decode_cudagraph_batch_sizes`` /
      ``decode_left_context_frames`` where the deploy sets them) and, on a CUDA device unless ``enforce_eager``,
      enables its decoder's CUDA graph with them. Where the deploy names no ``decode_cudagraph_batch_sizes``
      (vLLM-Omni 0.30's does not: its decoder then captures batch 1 only, and splits every group of concurrent
      chunks into batch-1 replays), they are :func:`decoder_graph_batch_sizes` of its ``decode_batch_max_size``
      (4: ``[1, 2, 4]``), so concurrent utterances' chunks replay together. ``window`` (the chunking the stage graph runs, e.g.
      ``--chunk-frames``) gives the first-chunk and chunk frame counts when given;
    - ``async_chunk``: the deploy's (True in vLLM-Omni 0.30): the model keeps each utterance's decoder state
      across its chunk requests (keyed by the utterance, :func:`core.pipeline.declarations.qwen3_tts.load` sets
      ``audio_request_state``) and decodes only each chunk's new frames; its decoder graph is captured at the
      chunk shapes of that protocol. Without it, each chunk request carries its left context and is decoded
      statelessly.
    """
    from core.patches.model_config_fields import additional_config

    extra = {**deploy.connector["extra"], "stage_id": STAGES.index("code2wav")}
    if extra.get("decode_cudagraph_batch_sizes") is None:  # the decoder graph at every batch the model decodes
        sizes = decoder_graph_batch_sizes(int(extra.get("decode_batch_max_size") or 0))
        if sizes:
            extra["decode_cudagraph_batch_sizes"] = sizes
    if window is not None:
        extra.update(codec_chunk_frames=int(window.chunk_frames),
                     initial_codec_chunk_frames=int(window.first_chunk_frames))
        if not deploy.async_chunk:  # async: the model holds the context; the deploy's window stays its setting
            extra["codec_left_context_frames"] = int(window.left_context_frames or 0)
    return additional_config(stage_connector_config={"name": deploy.connector["name"], "extra": extra},
                             async_chunk=bool(deploy.async_chunk))


def decoder_graph_batch_sizes(max_batch: int) -> list[int]:
    """The batch sizes the code2wav decoder's CUDA graph is captured at for groups of at most ``max_batch``
    concurrent chunks (vLLM-Omni's ``decode_batch_max_size``): the powers of two below it and itself, e.g.
    4 -> ``[1, 2, 4]``, 6 -> ``[1, 2, 4, 6]`` (its wrapper replays a group on the smallest captured batch that
    holds it, padding the rest); ``[]`` for ``max_batch`` <= 1 (no batching: vLLM-Omni's default, batch 1)."""
    if max_batch <= 1:
        return []
    sizes, p = [], 1
    while p < max_batch:
        sizes.append(p)
        p *= 2
    return sizes + [max_batch]


def talker_frames(output: Any) -> Any:
    """The codec frames in a talker ``RequestOutput``: int64 ``[n, Q]`` on the CPU (``n`` may be 0).

    vLLM-Omni's ``talker2code2wav_full_payload`` (``stage_input_processors/qwen3_tts.py``) reads the rows the talker
    emitted (``multimodal_outputs["codes.audio"]``, one per scheduled position), drops the invalid ones (the
    prompt's all-zero placeholder rows, negative or out-of-codebook rows) and keeps at most
    ``len(token_ids) - 1`` (the generated frames); its flat codebook-major codes are reshaped back to
    ``[n, Q]``. For a ``DELTA`` output this is the frames of that delta. A talker output with no valid frame
    yields vLLM-Omni's one placeholder frame (all ones), as its producer does. Imports torch and vLLM."""
    import torch

    from core.models.vllm_omni import load_module

    mm = getattr(output, "multimodal_outputs", None) or {}
    rows = mm.get("codes.audio")
    if rows is None or rows.numel() == 0:
        return torch.zeros((0, 0), dtype=torch.long)
    proc = load_module("model_executor.stage_input_processors.qwen3_tts")
    token_ids = list(output.outputs[0].token_ids) if getattr(output, "outputs", None) else []
    request = type("TalkerRequest", (), {"request_id": getattr(output, "request_id", "?"),
                                         "output_token_ids": token_ids})()
    payload = proc.talker2code2wav_full_payload(None, {"codes.audio": rows}, request)
    flat = payload["codes"]["audio"].to(torch.long)
    q = int(rows.shape[-1])
    return flat.reshape(q, -1).t().contiguous()


def code2wav_inputs(codes: Any, *, left_context: int = 0) -> tuple[dict, Any]:
    """``(prompt, sampling_params)`` of a code2wav request for ``codes`` (int ``[n, Q]``), whose first
    ``left_context`` frames are context for the decoder's window (the frames before the chunk, at most the
    deploy's ``left_context_frames``; their samples are dropped by :func:`code2wav_waveform`).

    ``prompt``: ``{"prompt_token_ids": codes.t().reshape(-1).tolist()}``, codebook-major ``[Q * n]`` as vLLM-Omni's
    producers flatten them; ``sampling_params``: one step, no detokenizing (a generation stage runs one forward).
    Raises ``BadInputError`` for a shape that is not ``[n, Q]`` with ``n > left_context``."""
    from vllm.sampling_params import SamplingParams

    if getattr(codes, "ndim", 0) != 2 or codes.shape[0] <= left_context or left_context < 0:
        raise BadInputError(f"code2wav codes must be [frames, Q] with more frames than left_context "
                            f"({left_context}), got shape {tuple(getattr(codes, 'shape', ()))}")
    return ({"prompt_token_ids": codes.t().reshape(-1).tolist()},
            SamplingParams(max_tokens=1, detokenize=False))


def code2wav_waveform(output: Any, *, left_context: int = 0, frames: int | None = None) -> Any:
    """The waveform of a code2wav ``RequestOutput``: float32 ``[samples]`` on the CPU, the first ``left_context``
    frames' samples dropped (``multimodal_outputs["model_outputs"]``; samples per frame = its length / ``frames``,
    the request's frame count, needed when ``left_context > 0``). Raises ``ValueError`` when the output has no
    waveform."""
    import torch

    mm = getattr(output, "multimodal_outputs", None) or {}
    wav = mm.get("model_outputs")
    if wav is None:
        raise ValueError(f"code2wav output {getattr(output, 'request_id', '?')} has no model_outputs")
    wav = wav.reshape(-1).to(device="cpu", dtype=torch.float32)
    if left_context:
        if not frames:
            raise ValueError("code2wav_waveform: give frames (the request's frame count) with left_context")
        wav = wav[wav.shape[0] // frames * left_context:]
    return wav


def sample_rate(output: Any, default: int = 24000) -> int:
    """The sample rate (Hz) a code2wav ``RequestOutput`` reports (``multimodal_outputs["sr"]``), else ``default``."""
    sr = (getattr(output, "multimodal_outputs", None) or {}).get("sr")
    return int(sr.reshape(-1)[0]) if sr is not None else default


__all__ = ["STAGES", "code2wav_inputs", "code2wav_model_config", "decoder_graph_batch_sizes", "code2wav_waveform", "sample_rate",
           "stage_engine_args", "talker_frames"]
