"""``ServeConfig.graph_config``: the one place the serve options become the stage graph's (``serve`` starts its graph
from it, and ``bench/bench_serve.py --inproc-only`` starts the same graph without HTTP from it). No engines."""

from __future__ import annotations

import dataclasses

from core.pipeline.config import GraphConfig
from core.serving.server import ServeConfig


def test_graph_config_carries_every_engine_option_of_serve(test_device: str) -> None:
    cfg = ServeConfig(device=test_device, model_dir="/tmp/demo-models", chunk_frames=7, enforce_eager=True,
                      graph_mode="none", runner="v1", seed=123,
                      stage_overrides={"0": {"default_sampling_params": {"ignore_eos": True}}})
    g = cfg.graph_config(test_device)
    assert isinstance(g, GraphConfig)
    # every GraphConfig field that ServeConfig also has comes from it; the rest are the graph's own defaults
    # except the device (the selected driver's name) -- so a new engine option on both cannot be left behind
    shared = {f.name for f in dataclasses.fields(GraphConfig)} & {f.name for f in dataclasses.fields(ServeConfig)}
    assert shared - {"device"} >= {"model", "model_dir", "chunk_frames", "seed", "enforce_eager", "graph_mode",
                                   "runner", "stage_overrides"}
    for name in shared - {"device"}:
        assert getattr(g, name) == getattr(cfg, name), name
    assert g.device == test_device and g.stat_loggers is None  # vLLM's stats: serve adds its loggers itself
