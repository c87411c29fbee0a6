"""Issue 11: two ranks on two GPUs through the cuda driver's rank -> device mapping.

    python3 bench/two_gpu_check.py --out DIR        # on nvidia-h200-x2 (torch only; vLLM is not needed)
    python3 bench/two_gpu_check.py --dry-run        # anywhere: print the plans, launch nothing

For ``CUDA_VISIBLE_DEVICES`` = ``"0,1"`` and ``"1,0"``, and for both ways a
child can receive its device:

- ``inherit``: the child keeps the parent's visible list and binds
  ``RankDevice.index`` (what vLLM's multiprocess executor does: device
  ``cuda:<local_rank>``);
- ``isolate``: the child gets ``RankDevice.env`` (only its own GPU visible)
  and binds index 0;

the parent computes :func:`omni_backends.placement.plan` for the
``CudaBackend`` from a *copy* of its environment (its own ``os.environ`` is
never changed) and starts one process per rank. Each rank

1. binds its device through the driver (``CudaBackend.set_device``) and checks
   ``torch.cuda.current_device()``, the device UUID and the PCI bus id
   against NVML's record of the physical GPU the mapping named (NVML, read
   by the parent, numbers GPUs by PCI bus; the children run with
   ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so CUDA ordinals agree);
2. creates the process group with the driver's distributed backend name
   (``RankDevice.dist_backend``, ``nccl``) and all-reduces 1 Ki and 16 Mi
   float32 elements, checking the exact sum;
3. replays a graph-captured step (``KitOps.new_graph`` / ``graph_capture``:
   matmul + bias + GELU, fresh inputs copied into the static buffer) and
   compares every replay with the eager result. Reported apart (not part of
   the pass): a graph that captures the process group's NCCL all-reduce,
   replayed with fresh values.

A negative check needs no GPU: ``CUDA_VISIBLE_DEVICES="0"`` with two ranks
must fail with "needs 2 cuda devices ..., only 1 visible".

NVLink multicast stays off in every child (``NCCL_NVLS_ENABLE=0``,
``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``, ``NVSHMEM_DISABLE_NVLS=1``), as that
machine requires. Results: one JSON line per rank on stdout and, with
``--out``, ``two_gpu_check.json`` + ``two_gpu_check.md`` (date, host, GPUs,
driver, torch/NCCL versions, per-rank table). Exit status 0 only if every
check passed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

#: variables the nvidia-h200-x2 machine requires in every process (no NVLink multicast)
SAFETY_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
VISIBLE_CASES = ("0,1", "1,0")
MODES = ("inherit", "isolate")
WORLD = 2


# ------------------------------------------------------------------ parent
def nvml_gpus() -> list[dict]:
    """Physical GPUs in NVML (PCI bus) order: index, uuid, pci bus id. Creates no CUDA context."""
    import pynvml

    pynvml.nvmlInit()
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            bus = pynvml.nvmlDeviceGetPciInfo(h).busId
            out.append({"index": i, "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
                        "pci_bus_id": bus.decode() if isinstance(bus, bytes) else bus,
                        "name": _s(pynvml.nvmlDeviceGetName(h))})
        return out
    finally:
        pynvml.nvmlShutdown()


def _s(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def parse_bus_id(bus_id: str) -> tuple[int, int, int]:
    """``"00000000:18:00.0"`` -> ``(domain, bus, device)``."""
    m = re.match(r"^([0-9A-Fa-f]+):([0-9A-Fa-f]+):([0-9A-Fa-f]+)\.[0-9A-Fa-f]+$", bus_id.strip())
    if not m:
        raise ValueError(f"unexpected PCI bus id {bus_id!r}")
    return int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def negative_check() -> dict:
    from omni_backends.cuda.driver import CudaBackend
    from omni_backends.placement import PlacementError, plan

    try:
        plan(CudaBackend, WORLD, {"CUDA_VISIBLE_DEVICES": "0"})
    except PlacementError as exc:
        ok = "needs 2 cuda devices (one per rank), only 1 visible" in str(exc)
        return {"check": "short visible list fails fast", "ok": ok, "message": str(exc)}
    return {"check": "short visible list fails fast", "ok": False, "message": "no error raised"}


def run_case(visible: str, mode: str, gpus: list[dict], timeout: float) -> list[dict]:
    from omni_backends.cuda.driver import CudaBackend
    from omni_backends.placement import plan

    view = dict(os.environ, CUDA_VISIBLE_DEVICES=visible)  # a copy: the parent's environment is not changed
    ranks = plan(CudaBackend, WORLD, view, device_count=len(gpus))
    port = free_port()
    procs = []
    for r in ranks:
        phys = gpus[int(r.device_id)]
        env = dict(view, **SAFETY_ENV, CUDA_DEVICE_ORDER="PCI_BUS_ID", PYTHONUNBUFFERED="1")
        if mode == "isolate":
            env.update(r.env)
        spec = {
            "rank": r.local_rank, "world": WORLD, "port": port, "visible": visible, "mode": mode,
            "index": r.index if mode == "inherit" else 0, "device_id": r.device_id,
            "dist_backend": r.dist_backend, "expect_uuid": phys["uuid"], "expect_bus": phys["pci_bus_id"],
            "child_visible": env["CUDA_VISIBLE_DEVICES"],
        }
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, err = p.communicate()
            err += f"\n[timed out after {timeout:.0f} s]"
        line = next((ln for ln in reversed(out.splitlines()) if ln.startswith("{")), None)
        res = json.loads(line) if line else {"ok": False}
        res.setdefault("visible", visible)
        res.setdefault("mode", mode)
        res["returncode"] = p.returncode
        if not res.get("ok"):
            res["stderr_tail"] = err[-3000:]
        results.append(res)
    return results


def versions() -> dict:
    out = {"python": platform.python_version(), "host": platform.node()}
    try:
        import torch

        out["torch"] = torch.__version__
        out["cuda"] = torch.version.cuda
        out["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None
    except Exception as exc:  # report, the children will fail loudly anyway
        out["torch_error"] = repr(exc)
    try:
        out["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=index,name,pci.bus_id,driver_version",
                                            "--format=csv,noheader"], capture_output=True, text=True,
                                           timeout=60).stdout.strip().splitlines()
    except Exception as exc:
        out["nvidia_smi"] = [repr(exc)]
    return out


def to_markdown(report: dict) -> str:
    lines = [f"## two_gpu_check ({report['date']})", "",
             f"- host {report['versions'].get('host')}; torch {report['versions'].get('torch')} (CUDA "
             f"{report['versions'].get('cuda')}, NCCL {report['versions'].get('nccl')})",
             *[f"- GPU {g['index']}: {g['name']} uuid {g['uuid']} bus {g['pci_bus_id']}" for g in report["gpus"]],
             f"- safety env in every rank: {', '.join(f'{k}={v}' for k, v in SAFETY_ENV.items())}",
             f"- {report['negative']['check']}: {'ok' if report['negative']['ok'] else 'FAILED'} "
             f"({report['negative']['message'][:120]}...)", "",
             "| CUDA_VISIBLE_DEVICES | mode | rank | child sees | index | current_device | mapped physical | "
             "uuid ok | bus ok | dist | all-reduce | graph replay | ok | (captured all-reduce) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["ranks"]:
        lines.append(
            f"| {r.get('visible')} | {r.get('mode')} | {r.get('rank')} | {r.get('child_visible')} | {r.get('index')} "
            f"| {r.get('current_device')} | {r.get('device_id')} | {r.get('uuid_ok')} | {r.get('bus_ok')} "
            f"| {r.get('dist_backend_in_use')} | {r.get('allreduce_ok')} | {r.get('graph_ok')} "
            f"| {'PASS' if r.get('ok') else 'FAIL'} | {r.get('graph_allreduce_ok')} |")
    lines += ["", f"overall: {'PASS' if report['ok'] else 'FAIL'}", ""]
    return "\n".join(lines)


def parent(args: argparse.Namespace) -> int:
    if args.dry_run:
        from omni_backends.cuda.driver import CudaBackend
        from omni_backends.placement import plan

        for visible in VISIBLE_CASES:
            for r in plan(CudaBackend, WORLD, {"CUDA_VISIBLE_DEVICES": visible}, device_count=WORLD):
                print(json.dumps({"visible": visible, **r.to_json()}))
        print(json.dumps(negative_check()))
        return 0
    gpus = nvml_gpus()
    if len(gpus) < WORLD:
        print(f"needs {WORLD} GPUs, NVML sees {len(gpus)}: run on nvidia-h200-x2", file=sys.stderr)
        return 2
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "versions": versions(), "gpus": gpus, "negative": negative_check(), "ranks": []}
    for visible in VISIBLE_CASES:
        for mode in MODES:
            for res in run_case(visible, mode, gpus, args.timeout):
                print(json.dumps(res), flush=True)
                report["ranks"].append(res)
    report["ok"] = bool(report["negative"]["ok"] and report["ranks"] and all(r.get("ok") for r in report["ranks"]))
    md = to_markdown(report)
    print(md)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "two_gpu_check.json"), "w") as f:
            json.dump(report, f, indent=1)
        with open(os.path.join(args.out, "two_gpu_check.md"), "w") as f:
            f.write(md)
    from record import write_record

    write_record(__file__, report, device="cuda")
    return 0 if report["ok"] else 1


# ------------------------------------------------------------------ child (one rank)
def _recorded(res: dict, key: str):
    """Decorator that runs a check at once, storing its bool in ``res[key]``, or
    False and the exception in ``res[key + '_error']``: one failing check must
    not hide the others."""

    def wrap(fn):
        try:
            res[key] = bool(fn())
        except Exception as exc:
            import traceback

            res[key] = False
            res[key + "_error"] = "".join(traceback.format_exception_only(exc)).strip()[-1500:]
        return fn

    return wrap


def _checks(res: dict, spec: dict, backend, device, rank: int) -> None:
    import torch
    import torch.distributed as dist

    world = spec["world"]

    @_recorded(res, "allreduce_ok")
    def _allreduce():
        ok = True
        for n in (1024, 16 * 1024 * 1024):
            base = torch.arange(n, device=device, dtype=torch.float32).remainder_(4096)
            x = base * (rank + 1)
            dist.all_reduce(x)
            ok &= bool(torch.equal(x, base * sum(range(1, world + 1))))
        return ok

    side = backend.new_stream()

    def warm_up(fn):
        side.wait_stream(backend.current_stream())
        with backend.stream_context(side):
            for _ in range(3):
                fn()
        backend.current_stream().wait_stream(side)

    @_recorded(res, "graph_ok")
    def _graph():  # a local step captured through the driver's graph primitive
        g = torch.Generator(device=device).manual_seed(1234)
        w = torch.randn(256, 256, device=device, generator=g)
        b = torch.randn(256, device=device, generator=g)
        static_x = torch.zeros(8, 256, device=device)

        def step(inp):
            return torch.nn.functional.gelu(inp @ w + b)

        warm_up(lambda: step(static_x))
        graph = backend.new_graph()
        with backend.graph_capture(graph):
            static_y = step(static_x)
        ok = True
        for _ in range(5):
            xi = torch.randn(8, 256, device=device, generator=g) + rank
            static_x.copy_(xi)
            graph.replay()
            ok &= bool(torch.allclose(static_y, step(xi), atol=1e-5, rtol=1e-5))
        return ok

    @_recorded(res, "graph_allreduce_ok")
    def _graph_allreduce():  # the process group's NCCL all-reduce inside a captured graph
        static_t = torch.zeros(4096, device=device)
        warm_up(lambda: dist.all_reduce(static_t))
        graph = backend.new_graph()
        with backend.graph_capture(graph):
            dist.all_reduce(static_t)
        ok = True
        for i in range(3):
            static_t.copy_(torch.full((4096,), float((rank + 1) * (i + 2)), device=device))
            graph.replay()
            backend.synchronize()
            ok &= bool(torch.all(static_t == float(sum((r + 1) * (i + 2) for r in range(world)))))
        return ok


def child(spec: dict) -> int:
    import torch
    import torch.distributed as dist

    from omni_backends.cuda.driver import CudaBackend

    res = dict(spec)
    res["pid"] = os.getpid()
    for k, v in SAFETY_ENV.items():
        if os.environ.get(k) != v:
            raise SystemExit(f"{k} must be {v} in every rank (NVLink multicast off); got {os.environ.get(k)!r}")
    backend = CudaBackend()
    rank, idx = spec["rank"], spec["index"]
    backend.set_device(idx)  # torch.accelerator.set_device_index through the driver
    res["current_device"] = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(idx)
    uuid = str(props.uuid).lower()
    res["uuid"] = uuid
    res["uuid_ok"] = uuid.removeprefix("gpu-") == spec["expect_uuid"].lower().removeprefix("gpu-")
    bus = tuple(getattr(props, a, None) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
    res["bus_source"] = "torch device properties"
    if None in bus:  # a torch without PCI fields: NVML's bus id of the GPU with this UUID
        import pynvml

        pynvml.nvmlInit()
        try:
            h = pynvml.nvmlDeviceGetHandleByUUID("GPU-" + uuid.removeprefix("gpu-"))
            bus = parse_bus_id(_s(pynvml.nvmlDeviceGetPciInfo(h).busId))
        finally:
            pynvml.nvmlShutdown()
        res["bus_source"] = "NVML by the device's UUID"
    res["pci"] = list(bus)
    res["bus_ok"] = tuple(bus) == parse_bus_id(spec["expect_bus"])
    device = backend.device(idx)

    dist.init_process_group(backend=spec["dist_backend"], init_method=f"tcp://127.0.0.1:{spec['port']}",
                            rank=rank, world_size=spec["world"], device_id=device)
    res["dist_backend_in_use"] = str(dist.get_backend())
    try:
        _checks(res, spec, backend, device, rank)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # the checks; graph_allreduce_ok (torch's NCCL process group inside a captured graph) is reported
    # on its own: vLLM captures its TP all-reduce through its own communicators, not this path
    res["ok"] = bool(res["current_device"] == idx and res["uuid_ok"] and res["bus_ok"]
                     and res["dist_backend_in_use"] == spec["dist_backend"] and res["allreduce_ok"]
                     and res["graph_ok"])
    print(json.dumps(res), flush=True)
    return 0 if res["ok"] else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="folder for two_gpu_check.json / .md")
    ap.add_argument("--dry-run", action="store_true", help="print the plans and the negative check; launch nothing")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per case (both ranks)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(json.loads(args.child))
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
