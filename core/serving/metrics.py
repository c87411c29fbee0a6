"""``GET /metrics``: vLLM's Prometheus metrics of each stage's engine, labelled ``stage``, plus the server's own
(time to first audio chunk, real-time factor, requests in flight, requests by outcome, audio seconds).

Three ``AsyncLLM`` engines in one process cannot each keep vLLM's default ``PrometheusStatLogger`` in
prometheus_client's global registry: its ``__init__`` calls ``unregister_vllm_metrics()``, so the last engine
built unregisters the first two engines' collectors. :func:`stage_stat_logger` makes, per stage, a subclass of
vLLM's logger whose collectors are moved into a registry of that stage as soon as they are made (under one lock,
so engines started concurrently never see each other's); :class:`StageMetricsCollector` then exposes all stages'
families merged, each sample with a ``stage`` label. Pass ``stat_loggers=[stage_stat_logger(stage, registry)]``
to the stage's ``AsyncLLM`` (vLLM's ``StatLoggerManager`` uses an ``AggregateStatLoggerBase`` subclass it is
given instead of its default Prometheus logger).

Importing this module imports prometheus_client only; vLLM is imported by :func:`stage_stat_logger`.
"""

from __future__ import annotations

import threading
from typing import Any, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import REGISTRY, Collector

from core.seams import PROMETHEUS_STAT_LOGGER

#: prometheus_client's text exposition format
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_MOVE_LOCK = threading.Lock()


def _vllm_collectors(registry: CollectorRegistry) -> list[Any]:
    """The collectors in ``registry`` whose metric names start with ``vllm:``."""
    return [c for c, names in list(registry._collector_to_names.items())
            if any(n.startswith("vllm:") for n in names)]


def stage_stat_logger(stage: str, registry: CollectorRegistry) -> type:
    """A subclass of vLLM's ``PrometheusStatLogger`` (``core.seams.PROMETHEUS_STAT_LOGGER``) whose metrics land
    in ``registry`` instead of prometheus_client's global one; ``stage`` names the class. Built by vLLM's
    ``StatLoggerManager`` as ``cls(vllm_config=..., engine_indexes=[...])``."""
    base = PROMETHEUS_STAT_LOGGER.resolve()

    def __init__(self: Any, vllm_config: Any, engine_indexes: list[int] | None = None) -> None:
        with _MOVE_LOCK:  # vLLM registers into the global REGISTRY (and first unregisters every vllm: collector)
            before = set(map(id, _vllm_collectors(REGISTRY)))
            base.__init__(self, vllm_config, engine_indexes)
            for collector in _vllm_collectors(REGISTRY):
                if id(collector) not in before:
                    REGISTRY.unregister(collector)
                    registry.register(collector)

    return type(f"OmniPrometheusStatLogger_{stage}", (base,), {"__init__": __init__})


class StageMetricsCollector(Collector):
    """Each stage registry's metric families merged by name, every sample labelled ``stage=<name>``
    (``registries``: stage -> ``CollectorRegistry``)."""

    def __init__(self, registries: Mapping[str, CollectorRegistry]):
        self.registries = dict(registries)

    def collect(self) -> Iterable[Metric]:
        merged: dict[str, Metric] = {}
        for stage, registry in self.registries.items():
            for family in registry.collect():
                out = merged.get(family.name)
                if out is None:
                    out = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                for s in family.samples:
                    out.add_sample(s.name, {"stage": stage, **s.labels}, s.value, s.timestamp, s.exemplar)
        return list(merged.values())


#: time to first audio chunk, seconds (since the request reached the graph)
TTFA_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0)
#: real-time factor: wall seconds per second of audio (below 1: faster than real time)
RTF_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 25.0, 100.0)


class ServingMetrics:
    """The server's own metrics (registry ``self.registry``) and, through :class:`StageMetricsCollector`, the
    stages' vLLM metrics (``stage_registries``: stage -> registry; empty when the engines keep vLLM's defaults).

    - ``omni_serve:time_to_first_audio_seconds`` (histogram), ``omni_serve:real_time_factor`` (histogram),
    - ``omni_serve:requests_in_flight`` (gauge), ``omni_serve:requests_total{outcome}`` (counter; outcome
      ``ok``, ``bad_request``, ``too_large`` (413), ``rejected`` (429), ``aborted`` (client gone), ``failed`` (a
      stage failed, or the server did)),
    - ``omni_serve:audio_seconds_total`` (counter).
    """

    def __init__(self, stage_registries: Mapping[str, CollectorRegistry] | None = None):
        self.registry = CollectorRegistry()
        self.ttfa = Histogram("omni_serve:time_to_first_audio_seconds", "Time from a request reaching the stage "
                              "graph to its first audio chunk (seconds).", buckets=TTFA_BUCKETS, registry=self.registry)
        self.rtf = Histogram("omni_serve:real_time_factor", "Wall seconds per second of audio, per request.",
                             buckets=RTF_BUCKETS, registry=self.registry)
        self.in_flight = Gauge("omni_serve:requests_in_flight", "Speech requests being synthesised.",
                               registry=self.registry)
        self.requests = Counter("omni_serve:requests", "Speech requests by outcome.", ["outcome"],
                                registry=self.registry)
        self.audio_seconds = Counter("omni_serve:audio_seconds", "Seconds of audio sent.", registry=self.registry)
        self.stages = CollectorRegistry()
        self.stages.register(StageMetricsCollector(stage_registries or {}))

    def finished(self, outcome: str, first_chunk_s: float | None = None, wall_s: float | None = None,
                 audio_s: float | None = None) -> None:
        """Count one finished request; with its timings (seconds) when it produced audio."""
        self.requests.labels(outcome=outcome).inc()
        if first_chunk_s is not None:
            self.ttfa.observe(first_chunk_s)
        if audio_s:
            self.audio_seconds.inc(audio_s)
            if wall_s is not None:
                self.rtf.observe(wall_s / audio_s)

    def exposition(self) -> bytes:
        """The text exposition: the server's metrics, then the stages' vLLM metrics."""
        return generate_latest(self.registry) + generate_latest(self.stages)
