"""NVML calls on a worker thread, waited for at most a timeout.

A hung driver (a GPU stuck in reset, a wedged kernel module) can block an NVML call for
minutes. The agent's API, sampling and heartbeats share one event loop, so the backend runs
its NVML work here: the caller waits at most `timeout` seconds, and while a call is still
stuck every later call fails at once instead of queueing behind it. The worker is a daemon
thread, so a call that never returns does not keep the agent from exiting.
"""

import logging
import queue
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

log = logging.getLogger(__name__)


class NvmlHung(Exception):
    """NVML did not answer in time, or an earlier call still has not returned."""


class Worker:
    def __init__(self, name: str = "nvml"):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._stuck: Future | None = None
        self._stuck_since = 0.0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            future, fn, args = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)

    def call(self, timeout: float, fn, *args):
        """fn(*args) on the worker thread; NvmlHung when it takes over `timeout` seconds or
        an earlier call is still stuck. On the worker thread itself, just fn(*args)."""
        if threading.current_thread() is self._thread:
            return fn(*args)
        with self._lock:
            if self._stuck is not None:
                if not self._stuck.done():
                    waited = time.monotonic() - self._stuck_since
                    raise NvmlHung(f"an NVML call has not returned for {waited:.0f} s")
                log.warning("NVML answers again")
                self._stuck = None
            future: Future = Future()
            self._jobs.put((future, fn, args))
            try:
                return future.result(timeout)
            except FutureTimeout:
                self._stuck, self._stuck_since = future, time.monotonic()
                log.error("NVML did not answer within %g s: the driver may be hung", timeout)
                raise NvmlHung(f"NVML did not answer within {timeout:g} s") from None

    def close(self) -> None:
        """Let the worker end once the call it runs (if any) returns."""
        self._jobs.put(None)
