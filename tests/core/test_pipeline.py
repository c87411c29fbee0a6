"""Issue 4: the main job on real vLLM, on pytest's ``--device`` (cpu in CI).

The talker/code2wav scenario runs once per engine variant the device offers
(``tests/core/conftest.py``); the ``omni-backends run`` tests run the main job
as a user does, with vLLM's defaults for the device."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import torch

from tests.core.precision import reference_settings, tolerance
from tests.core.reference import ReferenceCode2Wav, ReferenceTalker

pytestmark = [pytest.mark.engine_tier, pytest.mark.slow]

CLI = [sys.executable, "-m", "omni_backends.cli"]


def _env(**extra):
    env = dict(os.environ)
    env.pop("OMNI_BACKENDS_DEVICE", None)
    env.pop("OMNI_BACKENDS_SELECTION", None)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.update(extra)
    return env


def _expected_mtp_mode(test_device: str, variant: str) -> str:
    from omni_backends.testing.kit import load_driver

    caps = load_driver(test_device).backend.capabilities()
    return "graph" if caps.talker_mtp_graph and variant.endswith("-graphs") else "eager"


def test_talker_codes_and_waveform_equal_plain_pytorch(run_scenario, demo_dir, test_device, variant):
    """Codes equal a plain-PyTorch loop of the talker; the waveform equals code2wav in plain PyTorch, both on the
    engine's device in fp32 with TF32 off (``tests/core/precision.py``), to that device's tolerance."""
    r = run_scenario("talker-batch", variant=variant)
    tol = tolerance(test_device, "float32", "waveform")
    with reference_settings(test_device):
        talker = ReferenceTalker(os.path.join(demo_dir, "talker"), test_device)
        c2w = ReferenceCode2Wav(os.path.join(demo_dir, "code2wav"), test_device)
        for h, (n, voice, frames), codes, wav in zip(r["hiddens"], r["requests"], r["codes"], r["waveforms"]):
            expect = talker.generate(h, voice, frames)
            assert codes.shape == (frames, 4)
            assert torch.equal(codes.to(torch.int64).cpu(), expect), (codes, expect)
            ref_wav = c2w.synthesize(codes.to(torch.int64))
            assert wav.shape == ref_wav.shape == (frames * 160,)
            torch.testing.assert_close(wav.cpu(), ref_wav, **tol)
    (worker,) = r["talker_workers"]
    assert worker["mtp_mode"] == _expected_mtp_mode(test_device, variant), worker
    if worker["mtp_mode"] == "graph":  # the MTP head really replayed captured graphs
        assert worker["mtp_graph"]["captured"] > 0 and worker["mtp_graph"]["replays"] > 0, worker


def test_generation_engine_refuses_max_tokens_other_than_one_and_keeps_running(run_scenario):
    r = run_scenario("talker-batch")
    assert r["refused"] is not None and "generation-kind omni engine" in r["refused"] and "max_tokens=1" in r["refused"]
    torch.testing.assert_close(r["waveform_again"], r["waveforms"][0])
    bad = r["bad_payloads"]  # refused in the caller's thread; the engines served the next request fine
    assert "voice id 9 out of range: use 0..3" in bad["voice"]
    assert "'thinker_hidden' has 7 rows but the prompt has 5 tokens" in bad["rows"]
    assert "codes must lie in [0, 128)" in bad["codes"]


def test_mtp_runs_once_per_decode_step_per_request(run_scenario):
    r = run_scenario("talker-batch")
    frames = [f for _, _, f in r["requests"]]
    prompts = [n for n, _, _ in r["requests"]]
    assert len(set(frames)) == 3 and len({v for _, v, _ in r["requests"]}) == 3
    # one codes.audio row per token position (prompt rows -1); one frame per decode step, i.e. per sampled
    # token except the last (its frame would be made at a step that never runs)
    assert r["code_rows"] == [n + f for n, f in zip(prompts, frames)]
    assert [len(t) for t in r["tokens"]] == [f + 1 for f in frames]
    assert r["mtp_calls"] == frames  # once per decode step, per request (multiprocess: the worker's record)
    if r["mtp_counts"]["rows"] is not None:  # the head's own calls: countable in-process only (the cpu run)
        assert r["mtp_counts"]["rows"] == sum(frames)  # the head ran on no other rows
        assert r["mtp_counts"]["calls"] == max(frames)  # one batched call per step with decode rows
    for codes, tokens in zip(r["codes"], r["tokens"]):  # a frame's codebook 0 is the token it was made for
        assert codes[:, 0].tolist() == tokens[:-1]
    # each request's residual codes are its own (the reference test pins the values)
    firsts = {tuple(c[0, 1:].tolist()) for c in r["codes"]}
    assert len(firsts) == 3


def test_same_seed_gives_identical_wav_bytes(tmp_path, demo_dir, test_device):
    """Two runs with one seed write the same bytes. Off cpu the two runs go at once (two pipelines sharing the
    device; ``ci/gpu/run.sh mainjobs`` runs five back to back), on cpu one after the other (CI's 2 cores)."""
    def start(out):
        return time.perf_counter(), subprocess.Popen(
            CLI + ["run", "--device", test_device, "--model-dir", demo_dir, "--out", str(out), "--seed", "5",
                   "--max-tokens", "8", "--prompt", "Hello omni", "--voice", "2", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())

    def finish(started):
        t0, proc = started
        stdout, stderr = proc.communicate(timeout=600)
        return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), time.perf_counter() - t0

    outs = [tmp_path / "run0", tmp_path / "run1"]
    if test_device == "cpu":
        done = [finish(start(o)) for o in outs]
    else:
        started = [start(o) for o in outs]
        done = [finish(s) for s in started]
    times = [t for _, t in done]
    for p, _ in done:
        assert p.returncode == 0, p.stderr[-4000:]
        summary = json.loads(p.stdout)
        assert summary["device"]["selected"] == test_device
        assert summary["stages"]["talker"]["generated_tokens"] == 16
        for stage in ("thinker", "talker", "code2wav"):  # per-stage engine start time, peak memory, what vLLM ran
            st = summary["stages"][stage]
            assert 0 < st["engine_start_seconds"] < st["seconds"], st
            assert st["seconds"] == round(st["engine_start_seconds"] + st["generation_seconds"], 3), st
            assert st["generation_seconds"] > 0, st
            assert st["peak_device_memory_bytes"] > 0, st
            assert st["engine"]["dtype"] == "float32"
            if test_device == "cpu":  # CI: in-process and eager, as before
                assert st["engine"]["enforce_eager"] and not st["engine"]["multiprocess"], st
            else:  # vLLM's defaults for the device, each stage's KV cache sized for its model
                assert not st["engine"]["enforce_eager"] and st["engine"]["multiprocess"], st
                assert st["engine"]["cudagraph_mode"] != "NONE" and st["gpu_memory_utilization"] < 0.1, st
        cs = summary["concurrent_start"]  # issue 25: the stages' engines started at once, the bound reported
        assert cs["overlapped"] and set(cs) >= {"slowest_start_seconds", "bound_seconds", "within_bound"}, cs
        assert cs["slowest_start_seconds"] == max(summary["stages"][s]["engine_start_seconds"] for s in summary["stages"])
        assert summary["stages"]["code2wav"]["chunks"] == 1  # 16 frames, --chunk-frames 16 (the default)
        assert "[1/3] thinker" in p.stderr and "[3/3] code2wav" in p.stderr  # progress
        assert "shutting down the engines" in p.stderr
        from core.cli import run_result_lines

        lines = run_result_lines(summary)  # what the command prints without --json, from this run's summary
        th = summary["stages"]["thinker"]
        assert f"tokens in {th['generation_seconds']:.3f} s (engine start {th['engine_start_seconds']:.1f} s)" in lines[1]
        assert ("within the goal" if cs["within_bound"] else "over the goal") in lines[4], lines[4]
    a, b = ((o / "out.wav").read_bytes() for o in outs)
    assert len(a) == 44 + 16 * 160 * 2  # WAV header + 16 frames x 160 samples x int16
    assert a == b
    assert (outs[0] / "codes.json").read_text() == (outs[1] / "codes.json").read_text()
    assert (outs[0] / "thinker.txt").read_text() == (outs[1] / "thinker.txt").read_text()
    print(f"run wall times: {times[0]:.1f} s, {times[1]:.1f} s")


#: tests whose point is a device that cannot run: they need no usable --device
_ANY_DEVICE_STATE = {"test_unknown_device", "test_unusable_device"}


@pytest.fixture(autouse=True)
def _device_flag(request, test_device):
    """``omni-backends run`` gets the test's ``--device``; a test that needs it usable skips (with the probe's
    reason) where it is not (``--device cuda`` on a machine without a GPU)."""
    global DEVICE_ARGS
    DEVICE_ARGS = ["--device", test_device]
    if request.node.originalname not in _ANY_DEVICE_STATE:
        from omni_backends.testing.kit import load_driver

        probe = load_driver(test_device).probe
        if probe is None or not probe.usable:
            pytest.skip(f"--device {test_device} is not usable here: {probe.reason if probe else 'no driver'}")


DEVICE_ARGS: list = []


def _bad(args, tmp_path, *, out_name="out", demo_dir=None):
    out = tmp_path / out_name
    cmd = CLI + ["run", "--out", str(out), *(DEVICE_ARGS if "--device" not in args else []), *args]
    if demo_dir:
        cmd += ["--model-dir", demo_dir]
    p = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300)
    assert p.returncode != 0
    errors = [line for line in p.stderr.splitlines() if line.startswith("omni-backends: error:")]
    assert len(errors) == 1, p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    assert not out.exists() or not any(out.iterdir()), "no output files may be left behind"
    leftovers = [n for n in os.listdir(tmp_path) if n.startswith(".omni-run-")]
    assert not leftovers
    return errors[0]


@pytest.fixture()
def broken_demo(tmp_path, demo_dir):
    def make(mutate):
        d = tmp_path / "broken"
        shutil.copytree(demo_dir, d)
        mutate(str(d))
        return str(d)
    return make


def test_unknown_device(tmp_path):
    msg = _bad(["--device", "tpu9"], tmp_path)
    assert "unknown device 'tpu9'" in msg and "cpu" in msg


def test_unusable_device(tmp_path, test_device):
    from tests.core.test_thinker_engine import unusable_device

    bad = unusable_device(test_device)
    msg = _bad(["--device", bad], tmp_path)
    assert "not usable here" in msg
    if bad == "cuda":
        assert "vLLM's CUDA build is not installed" in msg


def test_empty_prompt(tmp_path, demo_dir):
    assert "prompt is empty" in _bad(["--prompt", "  "], tmp_path, demo_dir=demo_dir)


def test_prompt_longer_than_context(tmp_path, demo_dir):
    msg = _bad(["--prompt", "omni " * 600], tmp_path, demo_dir=demo_dir)
    assert "exceeds the thinker's context" in msg


def test_voice_out_of_range(tmp_path, demo_dir):
    assert "voice must be in 0..3, got 9" in _bad(["--voice", "9"], tmp_path, demo_dir=demo_dir)


def test_missing_weight_file(tmp_path, broken_demo):
    d = broken_demo(lambda d: os.unlink(os.path.join(d, "talker", "model.safetensors")))
    msg = _bad([], tmp_path, demo_dir=d)
    assert "talker model: weight file" in msg and "missing" in msg


@pytest.mark.device_cpu
def test_head_dim_the_device_cannot_run(tmp_path, broken_demo):
    def shrink(d):
        p = os.path.join(d, "thinker", "config.json")
        cfg = json.load(open(p))
        cfg["head_dim"] = 16
        json.dump(cfg, open(p, "w"))
    msg = _bad([], tmp_path, demo_dir=broken_demo(shrink))
    assert "head_dim 16 cannot run on the cpu driver" in msg


@pytest.mark.parametrize("damage", ["delete", "truncate"])
def test_missing_or_corrupt_tokenizer(tmp_path, broken_demo, damage):
    def hurt(d):
        p = os.path.join(d, "thinker", "tokenizer.json")
        if damage == "delete":
            os.unlink(p)
        else:
            with open(p, "r+") as f:
                f.truncate(100)
    d = broken_demo(hurt)
    msg = _bad([], tmp_path, demo_dir=d)
    assert "thinker model: the tokenizer" in msg and f"demo-model create {d}" in msg


def test_missing_model_dir(tmp_path):
    msg = _bad(["--model-dir", str(tmp_path / "nope")], tmp_path)
    assert "does not exist" in msg and "demo-model create" in msg


def test_output_dir_not_writable(tmp_path, demo_dir):
    out = "/proc/omni-backends-out"  # not writable even for root (CI runs as root)
    p = subprocess.run(CLI + ["run", *DEVICE_ARGS, "--out", out, "--model-dir", demo_dir], capture_output=True, text=True,
                       env=_env(), timeout=300)
    assert p.returncode != 0
    assert f"omni-backends: error: cannot write the output --out {out}: creating a file in /proc failed" in p.stderr, p.stderr[-2000:]
    assert not os.path.exists(out)


def test_output_path_is_a_file(tmp_path, demo_dir):
    (tmp_path / "afile").write_text("x")
    p = subprocess.run(CLI + ["run", *DEVICE_ARGS, "--out", str(tmp_path / "afile"), "--model-dir", demo_dir],
                       capture_output=True, text=True, env=_env(), timeout=300)
    assert p.returncode != 0 and "is not a directory" in p.stderr
    assert (tmp_path / "afile").read_text() == "x"


def test_talker_and_code2wav_compiled_equal_plain_pytorch(run_scenario, demo_dir, test_device):
    """Under vLLM's compilation (cpu: Dynamo traced once, vLLM's warm-up on) the compiled decoder sees
    one kind of input: vLLM's dummy runs pass ``input_ids``, the omni models' real steps pass the
    embeddings they build (code2wav used to fail: ``'NoneType' object has no attribute 'size'``), and
    vLLM copies those into its graph buffers (``cudagraph_copy_inputs``, ``core.model_io.copy_graph_inputs``)."""
    if test_device != "cpu":
        pytest.skip("on this device the -graphs variants compile and capture the talker and code2wav")
    if os.environ.get("VLLM_CPU_CI_ENV"):
        pytest.skip("VLLM_CPU_CI_ENV is set: vLLM's CPU worker skips its warm-up")
    r = run_scenario("talker-batch", variant="v1-warmup")
    with reference_settings(test_device):
        talker = ReferenceTalker(os.path.join(demo_dir, "talker"), test_device)
        c2w = ReferenceCode2Wav(os.path.join(demo_dir, "code2wav"), test_device)
        for h, (n, voice, frames), codes, wav in zip(r["hiddens"], r["requests"], r["codes"], r["waveforms"]):
            assert torch.equal(codes.to(torch.int64), talker.generate(h, voice, frames))
            torch.testing.assert_close(wav.cpu(), c2w.synthesize(codes.to(torch.int64)),
                                       **tolerance(test_device, "float32", "waveform"))
