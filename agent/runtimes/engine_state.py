"""Whether the container engine answers, and since when it does not: what the agent's
heartbeat tells the console (agent/control.py), so that a host whose engine is down is shown
as such and its instances are not billed as running. It also keeps the agent's loops, which
all fail while the engine is away, from logging the outage every second: it is logged once
when it begins and once when it ends."""

import logging
import threading
import time

log = logging.getLogger(__name__)

DETAIL_CHARS = 300


class EngineState:
    """The engine at `url` as its last ping found it: up, or down since when and why."""

    def __init__(self, url: str, clock=time.time):
        self.url = url
        self._clock = clock
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._detail = ""

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def failed(self, error: Exception | str) -> None:
        """The engine did not answer (a refused connection, a timeout)."""
        detail = str(error)[:DETAIL_CHARS]
        with self._lock:
            first = self._down_since is None
            if first:
                self._down_since = self._clock()
            self._detail = detail
        if first:
            log.warning(
                "the container engine at %s does not answer: %s (the console is told in each "
                "heartbeat; logged again when it answers)",
                self.url,
                detail,
            )

    def answered(self) -> None:
        with self._lock:
            since, self._down_since, self._detail = self._down_since, None, ""
        if since is not None:
            log.warning(
                "the container engine at %s answers again, after %.0f s",
                self.url,
                self._clock() - since,
            )

    def report(self) -> dict:
        """What the heartbeat carries: {"state": "up"}, or down with since (epoch seconds) and
        the error."""
        with self._lock:
            if self._down_since is None:
                return {"state": "up"}
            return {"state": "down", "since": self._down_since, "detail": self._detail}
