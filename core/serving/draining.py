"""SIGTERM drains: :class:`DrainingServer`, a ``uvicorn.Server`` that keeps listening while it drains.

uvicorn's own handling of SIGTERM closes the listening socket at once (new connections are refused) and then
waits for the requests in flight. Behind a load balancer a refused connection is an error the client sees; a
503 says "go elsewhere". Here the first SIGTERM / SIGINT only marks the server draining (``state.draining``: new
speech requests and ``/health`` answer 503, the routes' own doing) and keeps accepting; uvicorn's shutdown starts
once no speech request is in flight (``state.in_flight`` is 0) or ``drain_timeout`` seconds have passed. A second
signal stops at once (as uvicorn's: a second SIGINT forces the exit). The signals are still re-raised after the
server stopped (uvicorn's ``capture_signals``), so the caller's handlers see them.
"""

from __future__ import annotations

import signal
import time
from typing import Any, Callable

import uvicorn


class DrainingServer(uvicorn.Server):
    """``uvicorn.Server(config)`` whose first SIGTERM / SIGINT drains (see the module doc). ``state``: the app's
    ``ServerState`` (``draining``, ``in_flight``); ``drain_timeout``: seconds to wait for the requests in flight;
    ``say``: one line when draining starts and when it ends."""

    def __init__(self, config: uvicorn.Config, state: Any, drain_timeout: float,
                 say: Callable[[str], None] | None = None):
        super().__init__(config)
        self.state = state
        self.drain_timeout = float(drain_timeout)
        self.say = say or (lambda line: None)
        self.drain_deadline: float | None = None

    def handle_exit(self, sig: int, frame: Any) -> None:  # uvicorn's signal handler (main thread)
        if self.drain_deadline is None and not self.should_exit:
            self._captured_signals.append(sig)
            self.drain_deadline = time.monotonic() + self.drain_timeout
            self.state.draining = True
            return
        super().handle_exit(sig, frame)
        if sig == signal.SIGINT and self.drain_deadline is not None:
            self.force_exit = True

    async def on_tick(self, counter: int) -> bool:
        stop = await super().on_tick(counter)
        if self.drain_deadline is None or stop:
            return stop
        if self.state.in_flight == 0 or time.monotonic() >= self.drain_deadline:
            left = self.state.in_flight
            self.say("drained: stopping" if not left else f"drain timeout: stopping with {left} request(s) in flight")
            self.config.timeout_graceful_shutdown = 2.0 if not left else 0.5
            return True
        return False


__all__ = ["DrainingServer"]
