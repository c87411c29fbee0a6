"""``omni-backends serve``: an OpenAI-compatible speech endpoint over the resident stage graph.

The modules, one job each, in the order they call one another (each imports only those below it):

- :mod:`~core.serving.cli`       the ``serve`` command (entry point ``omni_backends.commands``) and
  ``python -m core.serving``;
- :mod:`~core.serving.server`    ``ServeConfig``, ``serve``: the graph started once, uvicorn, SIGTERM drain, a
  dead stage -> exit 3;
- :mod:`~core.serving.app`       the FastAPI app: ``/v1/audio/speech`` (WAV, PCM, streamed PCM or SSE),
  ``/v1/audio/voices``, ``/v1/models``, ``/health``, ``/metrics``; 429, disconnect -> abort;
- :mod:`~core.serving.protocol`  the request's checks and the OpenAI-style error body;
- :mod:`~core.serving.metrics`   Prometheus: vLLM's per-stage metrics and the server's own.

The stage graph is :mod:`core.pipeline.graph` (``StageGraph``), the same one ``omni-backends run`` drives
in-process; the audio bytes come from :mod:`core.pipeline.audio`. Importing this package imports neither vLLM
nor torch nor FastAPI (docs/serving.md).
"""
