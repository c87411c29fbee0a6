"""Issue 3 on real vLLM: the omni runner equals stock vLLM, and multimodal
outputs reach the caller per request, in-process and multiprocess.

Runs on pytest's ``--device`` (cpu in CI; ``--device cuda`` on a GPU), once per
engine variant the device offers (``tests/core/conftest.py``: V1/V2 x eager /
vLLM's default compilation + CUDA graphs)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from tests.core.precision import COMPILED_APART_LOGPROB_ATOL, compiled_apart, reference_settings, tolerance
from tests.core.reference import reference_hidden

pytestmark = [pytest.mark.engine_tier, pytest.mark.slow]


def _check_variant(result: dict, device: str, variant: str) -> None:
    """The engine really ran the variant (vLLM resolved what the test asked for)."""
    cfg = result["config"]
    assert cfg["device"] == device
    assert cfg["use_v2_model_runner"] == variant.startswith("v2"), cfg
    if variant.endswith("-eager"):
        assert cfg["enforce_eager"] and cfg["compilation_mode"] == 0, cfg
    elif variant.endswith("-graphs"):  # vLLM's defaults for the device: compiled, graphs on
        assert not cfg["enforce_eager"] and cfg["compilation_mode"] != 0 and cfg["cudagraph_mode"] != "CUDAGraphMode.NONE", cfg
    elif variant.endswith("-warmup"):
        assert not cfg["enforce_eager"] and cfg["compilation_mode"] != 0, cfg


def test_same_tokens_and_logprobs_as_stock_vllm(run_scenario, test_device, variant):
    """The omni demo thinker (an ``LlamaForCausalLM`` subclass returning ``OmniOutput``) under the omni runner and
    stock ``LlamaForCausalLM`` with the same weights under vLLM's stock runner, the same batches step for step
    (``generate_as_one_batch``): identical tokens and logprobs, bit for bit -- except where the two classes'
    engines each compile their own graph (a GPU's graph variants): then tokens equal and logprobs within what two
    compilations of one model differ by (``tests/core/precision.py``, ``compiled_apart``)."""
    stock_run = run_scenario("stock-thinker", variant=variant)
    omni_run = run_scenario("omni-thinker", variant=variant)
    _check_variant(omni_run, test_device, variant)
    assert stock_run["config"] == omni_run["config"], "stock and omni engines must run the same vLLM configuration"
    _assert_same_outputs(stock_run["outputs"], omni_run["outputs"],
                         atol=COMPILED_APART_LOGPROB_ATOL if compiled_apart(omni_run["config"], test_device) else 0.0)


def test_a_stock_model_on_the_omni_runner_gives_stock_tokens_and_logprobs(run_scenario, test_device, variant):
    """vLLM's own LlamaForCausalLM (the thinker's weights) under the omni runner and under vLLM's stock runner,
    the same batches: bit for bit equal. On V2 the omni runner keeps the ModelState vLLM built for it
    (``core.hooks.contract.needs_omni_hooks``): nothing omni runs in its steps."""
    stock_run = run_scenario("stock-thinker", variant=variant)
    plain = run_scenario("omni-plain-thinker", variant=variant)
    assert stock_run["config"] == plain["config"]
    _assert_same_outputs(stock_run["outputs"], plain["outputs"])
    omni = run_scenario("omni-thinker", variant=variant)
    v2 = plain["config"]["use_v2_model_runner"]
    for w, o in zip(plain["workers"], omni["workers"]):
        assert w["runner_cls"].startswith("OmniAR"), w
        if v2:  # vLLM's own state for the stock class; the omni one composed over it for the omni thinker
            assert w["model_state_mro"][0] == "DefaultModelState", w
            assert o["model_state_mro"][:3] == ["OmniARModelState", "OmniModelStateMixin", "DefaultModelState"], o
        else:
            assert w["model_state_mro"] is None and o["model_state_mro"] is None, (w, o)


def _assert_same_outputs(stock: list, omni: list, atol: float = 0.0) -> None:
    """Tokens equal; logprobs bit for bit (``atol=0``), or within ``atol`` with the same top-logprob token ids."""
    assert len(stock) == len(omni) == 8
    lengths = {len(o["prompt_token_ids"]) for o in omni}
    assert len(lengths) >= 3, "prompts must differ in length"
    for s, o in zip(stock, omni):
        assert o["token_ids"] == s["token_ids"], (s["request_id"], s["token_ids"], o["token_ids"])
        assert len(o["logprobs"]) == len(s["logprobs"]) == len(s["token_ids"])
        if atol == 0.0:
            assert o["logprobs"] == s["logprobs"], (s["request_id"], _max_logprob_difference(s, o))
        else:
            assert [[t for t, _ in ls] for ls in o["logprobs"]] == [[t for t, _ in ls] for ls in s["logprobs"]]
            assert _max_logprob_difference(s, o) <= atol, (s["request_id"], _max_logprob_difference(s, o))
    # the batch really mixes greedy and seeded random sampling, with different lengths
    assert {len(o["token_ids"]) for o in omni} == {3, 5, 9, 12}
    assert omni[1]["token_ids"] != omni[5]["token_ids"], "seeded random sampling should differ from greedy here"


def _max_logprob_difference(s: dict, o: dict) -> float:
    return max((abs(a - b) for ls, lo in zip(s["logprobs"], o["logprobs"]) for (_, a), (_, b) in zip(ls, lo)),
               default=0.0)


def test_hidden_states_per_request_match_plain_pytorch(run_scenario, demo_dir, test_device, variant):
    """Per-request hidden states vs transformers' Llama on the same device, fp32, TF32 off on both sides
    (``tests/core/precision.py``), to that device's fp32 tolerance."""
    pytest.importorskip("transformers")
    omni = run_scenario("omni-thinker", variant=variant)["outputs"]
    tol = tolerance(test_device, "float32", "hidden")
    finishing_steps = set()
    with reference_settings(test_device):
        expect_of = reference_hidden(os.path.join(demo_dir, "thinker"), test_device)
        for o in omni[:4]:  # greedy requests: 4 requests finishing at 4 different steps
            ids = o["prompt_token_ids"] + o["token_ids"][:-1]
            hidden = o["multimodal_outputs"]["hidden"]
            assert hidden.shape == (len(ids), 128)
            torch.testing.assert_close(hidden.cpu(), expect_of(ids), **tol)
            finishing_steps.add(len(o["token_ids"]))
    assert len(finishing_steps) == 4
    # each request got its own states: no two requests share rows
    assert not torch.allclose(omni[0]["multimodal_outputs"]["hidden"][:2], omni[2]["multimodal_outputs"]["hidden"][:2])


def test_warm_up_and_dummy_runs_with_an_omni_model(run_scenario, test_device):
    """vLLM calls the model outside real steps (profile run, warm-up, graph capture: ``_dummy_run`` calls
    ``self.model(...)`` directly). On cpu this needs compilation on: vLLM's CPU worker warms up
    (``CPUModelRunner.warming_up_model`` -> ``profile_run`` -> ``_dummy_run``) only when the compilation mode is
    not NONE, i.e. not under ``enforce_eager`` (and always skips under ``VLLM_CPU_CI_ENV``). The omni model's
    ``OmniOutput`` must not reach that path, and the engine must then serve the same tokens as eager."""
    if test_device != "cpu":
        pytest.skip("on this device the -graphs variants run vLLM's warm-up, profile and capture paths")
    if os.environ.get("VLLM_CPU_CI_ENV"):
        pytest.skip("VLLM_CPU_CI_ENV is set: vLLM's CPU worker skips its warm-up")
    warm = run_scenario("omni-thinker", variant="v1-warmup")
    _check_variant(warm, test_device, "v1-warmup")
    eager = run_scenario("omni-thinker", variant="v1-eager")
    assert [o["token_ids"] for o in warm["outputs"]] == [o["token_ids"] for o in eager["outputs"]]
    for a, b in zip(warm["outputs"], eager["outputs"]):
        torch.testing.assert_close(a["multimodal_outputs"]["hidden"], b["multimodal_outputs"]["hidden"],
                                   atol=1e-5, rtol=1e-5)


def test_multiprocess_engine_reuses_the_parent_driver(run_scenario, test_device, variant):
    """The omni thinker in-process and in vLLM's multiprocess engine: same driver, omni worker in the child
    process; where vLLM resolves the same engine configuration for both layouts (async scheduling included), the
    same batches give bit-identical tokens, logprobs and hidden states."""
    inproc = run_scenario("omni-thinker", variant=variant, multiprocess=False)
    mp = run_scenario("omni-thinker-mp", variant=variant, multiprocess=True)
    same_config = {k: v for k, v in inproc["config"].items() if k != "multiprocess"} == \
        {k: v for k, v in mp["config"].items() if k != "multiprocess"}
    for a, b in zip(inproc["outputs"], mp["outputs"]):
        assert a["token_ids"] == b["token_ids"]
        if same_config and compiled_apart(inproc["config"], test_device):  # two compile caches: tests/core/precision.py
            assert _max_logprob_difference(a, b) <= COMPILED_APART_LOGPROB_ATOL, _max_logprob_difference(a, b)
            torch.testing.assert_close(a["multimodal_outputs"]["hidden"].cpu(), b["multimodal_outputs"]["hidden"].cpu(),
                                       **tolerance(test_device, "float32", "hidden"))
        elif same_config:
            assert a["logprobs"] == b["logprobs"], _max_logprob_difference(a, b)
            assert torch.equal(a["multimodal_outputs"]["hidden"].cpu(), b["multimodal_outputs"]["hidden"].cpu())
        else:  # e.g. vLLM turns async scheduling off in-process: other step boundaries, other batch shapes
            torch.testing.assert_close(a["multimodal_outputs"]["hidden"].cpu(), b["multimodal_outputs"]["hidden"].cpu(),
                                       **tolerance(test_device, "float32", "hidden"))
    (worker,) = mp["workers"]
    assert worker["pid"] != mp["parent_pid"], "multiprocess mode must run the worker in another process"
    assert worker["driver"] == test_device
    assert worker["worker_cls"] == "OmniARWorker"
    mixin = "OmniV2RunnerMixin" if variant.startswith("v2") else "OmniV1RunnerMixin"
    assert worker["runner_mro"][1] == mixin and worker["runner_mro"][0].startswith("OmniAR"), worker["runner_mro"]
    if test_device == "cpu":
        assert worker["runner_mro"][:3] == ["OmniARCPUModelRunner", "OmniV1RunnerMixin", "CPUModelRunner"]


def test_payloads_released_after_finish_and_abort(run_scenario, test_device):
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
    assert len(after["payload_ids"]) == 1 and match("live", after["payload_ids"]), after


def unusable_device(test_device: str) -> str:
    """A driver that is installed but not usable on this host (cuda on a CPU box, cpu's absence elsewhere)."""
    from omni_backends.registry import discover, safe_probe

    entries, _ = discover()
    for name in ("cuda", "npu", "xpu"):
        e = entries.get(name)
        if name != test_device and e is not None and e.cls is not None and not safe_probe(e.cls).usable:
            return name
    pytest.skip("every installed driver is usable here")


def test_unusable_device_fails_before_vllm_starts(demo_dir, test_device):
    bad = unusable_device(test_device)
    code = (
        "import sys\n"
        "from omni_backends.errors import DeviceNotUsableError\n"
        "from core.stage import make_engine\n"
        f"try:\n    make_engine({os.path.join(demo_dir, 'thinker')!r}, device={bad!r})\n"
        "except DeviceNotUsableError as e:\n"
        "    print('ERR', e)\n"
        "    print('VLLM_IMPORTED', 'vllm' in sys.modules)\n"
    )
    env = dict(os.environ)
    env.pop("OMNI_BACKENDS_DEVICE", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120).stdout
    assert f"ERR device {bad!r} was requested" in out, out
    assert "not usable here" in out and "To fix:" in out
    if bad == "cuda":
        assert "not installed" in out or "no NVIDIA GPU" in out
    assert "VLLM_IMPORTED False" in out
