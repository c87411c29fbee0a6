"""Rank -> device mapping (omni_backends.placement) for every driver's
visible-devices variable, on the real driver classes (identity only: no
vendor stack is imported). Pure logic; the device-level proof on two GPUs is
bench/two_gpu_check.py (issue 11)."""

from __future__ import annotations

import os
import threading

import pytest

from omni_backends.ascend.driver import AscendBackend
from omni_backends.cpu.driver import CpuBackend
from omni_backends.cuda.driver import CudaBackend
from omni_backends.placement import (
    PlacementError,
    check_worker_binding,
    device_for_rank,
    plan,
    visible_devices,
)
from omni_backends.xpu.driver import XpuBackend

CUDA, NPU, XPU, HIER = "CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES", "ZE_AFFINITY_MASK", "ZE_FLAT_DEVICE_HIERARCHY"


def ids(backend, world, env, device_count=None):
    return [r.device_id for r in plan(backend, world, env, device_count)]


# ------------------------------------------------------------------ identity from the driver
@pytest.mark.parametrize(
    "cls, variable, dist, device_type",
    [(CudaBackend, CUDA, "nccl", "cuda"), (AscendBackend, NPU, "hccl", "npu"),
     (XpuBackend, XPU, "xccl", "xpu"), (CpuBackend, None, "gloo", "cpu")],
)
def test_variable_dist_backend_and_device_type_come_from_the_driver(cls, variable, dist, device_type):
    assert cls.visible_devices_env == variable
    env = {variable: "0,1"} if variable else {}
    ranks = plan(cls, 2, env)
    assert [r.dist_backend for r in ranks] == [dist, dist]
    assert [r.device_type for r in ranks] == [device_type, device_type]
    if variable:
        assert [r.env for r in ranks] == [{variable: "0"}, {variable: "1"}]


def test_instance_distributed_backend_method_wins_over_the_class_attribute():
    class CclXpu(XpuBackend):  # oneCCL bindings instead of torch's xccl
        def distributed_backend(self) -> str:
            return "ccl"

    assert device_for_rank(CclXpu(load_vendor=False), 0, 1, {XPU: "0"}).dist_backend == "ccl"
    assert device_for_rank(CclXpu, 0, 1, {XPU: "0"}).dist_backend == "xccl"  # a class: its attribute
    assert device_for_rank(CpuBackend(), 1, 2, env={}).dist_backend == "gloo"
    assert device_for_rank(AscendBackend(load_vendor=False), 0, 1, env={NPU: "3"}).device_id == "3"


# ------------------------------------------------------------------ CUDA_VISIBLE_DEVICES
def test_cuda_follows_the_visible_order():
    r0, r1 = plan(CudaBackend, 2, {CUDA: "1,0"})
    assert (r0.index, r0.device_id, dict(r0.env)) == (0, "1", {CUDA: "1"})
    assert (r1.index, r1.device_id, dict(r1.env)) == (1, "0", {CUDA: "0"})


def test_cuda_non_contiguous_ids_and_uuids():
    assert ids(CudaBackend, 3, {CUDA: "6, 2,4"}, device_count=8) == ["6", "2", "4"]
    assert ids(CudaBackend, 2, {CUDA: "GPU-8f3e1c2a-aaaa,MIG-4b1d-bbbb/1/0"}) == ["GPU-8f3e1c2a-aaaa", "MIG-4b1d-bbbb/1/0"]
    with pytest.raises(PlacementError, match=r"names device\(s\) 9 but the host has 8"):
        plan(CudaBackend, 2, {CUDA: "2,9"}, device_count=8)


def test_cuda_unset_means_every_host_device_and_needs_a_count():
    assert ids(CudaBackend, 2, {}, device_count=4) == ["0", "1"]
    with pytest.raises(PlacementError, match="CUDA_VISIBLE_DEVICES is unset and the number of cuda devices is unknown"):
        plan(CudaBackend, 2, {})


@pytest.mark.parametrize("value, visible", [("0", 1), ("", 0), ("-1", 0), ("3", 1)])
def test_cuda_shorter_than_the_ranks_fails_fast(value, visible):
    with pytest.raises(PlacementError, match=f"needs 2 cuda devices \\(one per rank\\), only {visible} visible") as e:
        plan(CudaBackend, 2, {CUDA: value})
    assert f"CUDA_VISIBLE_DEVICES={value!r}" in str(e.value)


@pytest.mark.parametrize("value, message", [
    ("0,0", "lists device 0 twice"),
    ("1,01", "lists device 1 twice"),  # same ordinal spelled twice
    ("0,,1", "empty entry"),
    ("0,gpu1", "neither a GPU ordinal"),
    ("0,-1,1", "neither a GPU ordinal"),
])
def test_cuda_bad_lists_are_refused_not_guessed(value, message):
    with pytest.raises(PlacementError, match=message):
        plan(CudaBackend, 1, {CUDA: value})


# ------------------------------------------------------------------ ASCEND_RT_VISIBLE_DEVICES
def test_ascend_non_contiguous_ascending_ids():
    ranks = plan(AscendBackend, 3, {NPU: "1,4,6"}, device_count=8)
    assert [(r.index, r.device_id, dict(r.env)) for r in ranks] == [
        (0, "1", {NPU: "1"}), (1, "4", {NPU: "4"}), (2, "6", {NPU: "6"})]


def test_ascend_refuses_a_descending_list_and_a_short_one():
    with pytest.raises(PlacementError, match="not in ascending order; CANN supports only ascending") as e:
        plan(AscendBackend, 2, {NPU: "3,1"})
    assert "'1,3'" in str(e.value)
    with pytest.raises(PlacementError, match="needs 4 npu devices \\(one per rank\\), only 2 visible"):
        plan(AscendBackend, 4, {NPU: "0,1"})
    with pytest.raises(PlacementError, match="is not an NPU id"):
        plan(AscendBackend, 1, {NPU: "0, 1x"})


# ------------------------------------------------------------------ ZE_AFFINITY_MASK
def test_ze_flat_mask_and_card_tile_refused_outside_composite():
    assert ids(XpuBackend, 2, {XPU: "0,3"}) == ["0", "3"]
    for hierarchy in (None, "FLAT", "COMBINED"):
        env = {XPU: "0.1,1.0"} | ({HIER: hierarchy} if hierarchy else {})
        with pytest.raises(PlacementError, match="card.tile form"):
            plan(XpuBackend, 1, env)


def test_ze_composite_tiles_of_one_card_are_one_device():
    env = {XPU: "0.0,0.1,2", HIER: "composite"}
    vis = visible_devices(XpuBackend, env)
    assert vis.ids == ("0.0,0.1", "2")
    r0, r1 = plan(XpuBackend, 2, env)
    assert dict(r0.env) == {XPU: "0.0,0.1", HIER: "composite"}
    assert dict(r1.env) == {XPU: "2", HIER: "composite"}
    assert (r0.index, r1.index) == (0, 1)
    with pytest.raises(PlacementError, match="needs 3 xpu devices \\(one per rank\\), only 2 visible"):
        plan(XpuBackend, 3, env)
    with pytest.raises(PlacementError, match="both whole and by tile"):
        plan(XpuBackend, 1, {XPU: "0,0.1", HIER: "COMPOSITE"})
    with pytest.raises(PlacementError, match="lists device 1.0 twice"):
        plan(XpuBackend, 1, {XPU: "1.0,1.0", HIER: "COMPOSITE"})


def test_ze_descending_mask_is_refused():
    with pytest.raises(PlacementError, match="Level Zero keeps its own device order"):
        plan(XpuBackend, 2, {XPU: "1,0"})


# ------------------------------------------------------------------ CPU (no variable)
def test_cpu_ranks_share_the_one_device():
    ranks = plan(CpuBackend, 2, {CUDA: "0"})  # another driver's variable is ignored
    assert [(r.index, r.device_id, dict(r.env), r.device_type) for r in ranks] == [(0, "0", {}, "cpu")] * 2
    assert not visible_devices(CpuBackend, {}).exclusive


# ------------------------------------------------------------------ invariants
@pytest.mark.parametrize("cls, env, world", [
    (CudaBackend, {CUDA: "7,3,5,1"}, 4), (CudaBackend, {}, 8), (AscendBackend, {NPU: "0,2,4,6"}, 4),
    (XpuBackend, {XPU: "0.0,1.1,2.0,2.1", HIER: "COMPOSITE"}, 3),
])
def test_no_device_is_handed_to_two_ranks(cls, env, world):
    ranks = plan(cls, world, env, device_count=8)
    assert len({r.device_id for r in ranks}) == world
    assert len({r.index for r in ranks}) == world
    assert [r.local_rank for r in ranks] == list(range(world))


def test_rank_outside_the_world_is_refused():
    with pytest.raises(PlacementError, match=r"local_rank must be in \[0, 2\)"):
        device_for_rank(CudaBackend, 2, 2, {CUDA: "0,1,2"})
    with pytest.raises(PlacementError, match="world_size must be a positive int"):
        plan(CudaBackend, 0, {CUDA: "0"})


def test_mapping_is_pure_under_concurrent_engine_starts():
    """Two engines planning at once in threads, each with its own environment:
    each gets its own answer and nothing is written to os.environ."""
    before = dict(os.environ)
    jobs = {
        "a": (CudaBackend, {CUDA: "1,0"}, ["1", "0"]),
        "b": (CudaBackend, {CUDA: "3,2"}, ["3", "2"]),
        "c": (AscendBackend, {NPU: "4,5"}, ["4", "5"]),
    }
    barrier = threading.Barrier(len(jobs))
    seen: dict[str, set] = {k: set() for k in jobs}
    errors: list[BaseException] = []

    def start(key):
        cls, env, _ = jobs[key]
        frozen = dict(env)
        try:
            barrier.wait()
            for _ in range(300):
                seen[key].add(tuple(r.device_id for r in plan(cls, 2, env)))
            assert env == frozen, "the mapping wrote into the environment it was given"
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(k,)) for k in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert {k: v for k, v in seen.items()} == {k: {tuple(want)} for k, (_, _, want) in jobs.items()}
    assert dict(os.environ) == before


# ------------------------------------------------------------------ worker-side checks
class _TwoGpus(CudaBackend):
    """CudaBackend whose runtime reports two GPUs (pure-logic test of the binding check)."""

    def device_count(self) -> int:
        return 2


def test_worker_binding_mismatch_names_both_sides():
    torch = pytest.importorskip("torch")
    env = {CUDA: "1,0"}
    ok = check_worker_binding(_TwoGpus(), 1, 2, torch.device("cuda", 1), env)
    assert (ok.index, ok.device_id) == (1, "0")
    with pytest.raises(PlacementError, match=r"local rank 0 is bound to cuda:1 but driver 'cuda' maps it to cuda:0 "
                                             r"\(visible id 1\)"):
        check_worker_binding(_TwoGpus(), 0, 2, torch.device("cuda", 1), env)
    with pytest.raises(PlacementError, match="is bound to cpu"):
        check_worker_binding(_TwoGpus(), 0, 2, torch.device("cpu"), env)


def test_worker_refuses_a_process_group_on_another_backend(tmp_path):
    """A real gloo process group (world 1): fine for the cpu driver, refused for
    a driver whose distributed backend is nccl."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        assert check_worker_binding(CpuBackend(), 0, 1, torch.device("cpu"), {}).dist_backend == "gloo"
        with pytest.raises(PlacementError, match="backend 'gloo' but driver 'cuda' uses 'nccl'"):
            check_worker_binding(_TwoGpus(), 0, 1, torch.device("cuda", 0), {CUDA: "0"})
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------ parent-side check before vLLM starts
def _selection(backend, device_count):
    from omni_backends.backend import ProbeResult, ProbeState
    from omni_backends.registry import Candidate, Selection

    probe = ProbeResult(ProbeState.USABLE, "test", {}, device_count=device_count)
    return Selection(name=backend.name, rule="test", reason="test", notes=[], versions={},
                     candidates=[Candidate(backend.name, None, backend.priority, probe)], backend=backend)


def test_engine_that_needs_more_devices_than_visible_fails_before_workers_start():
    from omni_backends.placement import check_engine_fits, engine_world_size

    sel = _selection(CudaBackend(), device_count=8)
    ranks = check_engine_fits(sel, {"tensor_parallel_size": 2, "pipeline_parallel_size": 2}, {CUDA: "4,5,6,7"})
    assert [r.device_id for r in ranks] == ["4", "5", "6", "7"]
    with pytest.raises(PlacementError, match="needs 4 cuda devices \\(one per rank\\), only 2 visible"):
        check_engine_fits(sel, {"tensor_parallel_size": 2, "data_parallel_size": 2}, {CUDA: "0,1"})
    # unset variable: the probe's device count (NVML, no CUDA context) is the limit
    with pytest.raises(PlacementError, match="needs 16 cuda devices \\(one per rank\\), only 8 visible"):
        check_engine_fits(sel, {"tensor_parallel_size": 16}, {})
    # ranks that may span hosts are checked by each host's workers instead
    assert engine_world_size({"tensor_parallel_size": 16, "distributed_executor_backend": "ray"}) is None
    assert engine_world_size({"tensor_parallel_size": 16, "nnodes": 2}) is None
    assert check_engine_fits(sel, {"tensor_parallel_size": 16, "distributed_executor_backend": "ray"}, {}) == ()
    assert len(check_engine_fits(_selection(CpuBackend(), 1), {"tensor_parallel_size": 2}, {})) == 2


def test_worker_binding_under_an_executor_that_assigns_devices_checks_the_type_only():
    torch = pytest.importorskip("torch")
    env = {CUDA: "0,1"}
    got = check_worker_binding(_TwoGpus(), 0, 1, torch.device("cuda", 1), env, check_index=False)
    assert got.device_type == "cuda"
    with pytest.raises(PlacementError, match="is bound to cpu"):
        check_worker_binding(_TwoGpus(), 0, 1, torch.device("cpu"), env, check_index=False)


# ------------------------------------------------------------------ the rules live in the drivers
def test_an_out_of_tree_driver_brings_its_own_rules_without_editing_placement():
    """A driver with a variable placement has never heard of parses it itself (here: ids
    written ``dev<N>``) and says what a child gets; placement only maps ranks."""
    from omni_backends.errors import PlacementError as ErrorsPlacementError

    class Oot(CpuBackend):
        name = "oot"
        visible_devices_env = "OOT_VISIBLE"

        @classmethod
        def parse_visible_devices(cls, value, env, device_count=None):
            ids = tuple(e.removeprefix("dev") for e in value.split(","))
            if not all(i.isdigit() for i in ids):
                raise ErrorsPlacementError(f"OOT_VISIBLE={value!r}: write dev<N>")
            return ids

        @classmethod
        def child_env_for_device(cls, device_id, env):
            return {"OOT_VISIBLE": f"dev{device_id}", "OOT_MODE": env.get("OOT_MODE", "flat")}

    r0, r1 = plan(Oot, 2, {"OOT_VISIBLE": "dev3,dev1", "OOT_MODE": "tiles"})
    assert (r0.device_id, dict(r0.env)) == ("3", {"OOT_VISIBLE": "dev3", "OOT_MODE": "tiles"})
    assert (r1.index, r1.device_id) == (1, "1")
    with pytest.raises(PlacementError, match="write dev<N>"):
        plan(Oot, 1, {"OOT_VISIBLE": "gpu3"})


def test_a_driver_without_its_own_parser_gets_the_generic_rules():
    class Generic(CpuBackend):
        name = "generic"
        visible_devices_env = "GENERIC_VISIBLE"

    assert ids(Generic, 2, {"GENERIC_VISIBLE": "a7, 2"}) == ["a7", "2"]
    assert visible_devices(Generic, {"GENERIC_VISIBLE": ""}).ids == ()
    with pytest.raises(PlacementError, match="lists device 2 twice"):
        plan(Generic, 1, {"GENERIC_VISIBLE": "2,2"})
    with pytest.raises(PlacementError, match=r"names device\(s\) 5 but the host has 4"):
        plan(Generic, 1, {"GENERIC_VISIBLE": "5"}, device_count=4)


def test_each_driver_parses_its_own_variable():
    """One home per rule: the driver classes answer; placement holds no per-variable table."""
    import omni_backends.placement as placement

    assert CudaBackend.parse_visible_devices("GPU-ab12,01", {}) == ("GPU-ab12", "1")
    assert AscendBackend.parse_visible_devices("1, 4", {}) == ("1", "4")
    assert XpuBackend.parse_visible_devices("0.0,0.1", {HIER: "COMPOSITE"}) == ("0.0,0.1",)
    assert XpuBackend.child_env_for_device("2", {HIER: "COMPOSITE"}) == {XPU: "2", HIER: "COMPOSITE"}
    assert CudaBackend.child_env_for_device("1", {HIER: "COMPOSITE"}) == {CUDA: "1"}
    assert CpuBackend.child_env_for_device("0", {}) == {}
    assert not [n for n in vars(placement) if n.startswith("_parse")]
    assert not hasattr(placement, "PARSERS")


def test_placement_and_backend_import_one_way():
    """backend.py never imports placement (at module level or inside a function): no circle."""
    import ast
    import pathlib

    import omni_backends.backend as backend

    tree = ast.parse(pathlib.Path(backend.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "omni_backends.placement" not in imported
