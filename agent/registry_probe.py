"""Whether this host reaches the registries its images come from, before any launch needs one.

The console names the registries (PUT /v1/images/settings: those of its region's catalog
images; the mirror and the pre-pulls' registries are added here). Each is asked `GET
https://<registry>/v2/` (then `http://`, for a registry served without TLS, as a local
mirror often is), with a short timeout: an answer of 200 or 401 (it wants credentials) means
it is there. The answers are kept and asked again every PROBE_SECONDS, and at once for a
registry newly named; the inventory reports each with when it was asked and, when it cannot
be reached, why. The console tells tenants from it which images can be obtained
(console/fleet/image_availability.py).
"""

import logging
import threading
import time
from collections.abc import Callable, Iterable

import requests

log = logging.getLogger(__name__)

PROBE_SECONDS = 180.0
TIMEOUT_SECONDS = 3.0
MAX_REGISTRIES = 50
REACHABLE = frozenset({200, 401})
# Docker Hub's registry API is not served at the name its references use
API_HOSTS = {"docker.io": "registry-1.docker.io"}


def registry_of(normalized: str) -> str:
    """The registry of a normalized reference (`docker.io/library/ubuntu:latest` →
    `docker.io`)."""
    return normalized.partition("/")[0]


def check(registry: str, get: Callable = requests.get) -> dict:
    """Ask the registry once: `{"registry", "reachable", "error", "checked_at"}`."""
    host = API_HOSTS.get(registry, registry)
    errors = []
    for scheme in ("https", "http"):
        try:
            answer = get(f"{scheme}://{host}/v2/", timeout=TIMEOUT_SECONDS, allow_redirects=False)
        except requests.RequestException as exc:
            errors.append(f"{scheme}: {_short(exc)}")
            continue
        if answer.status_code in REACHABLE:
            return {"registry": registry, "reachable": True, "error": "", "checked_at": time.time()}
        errors.append(f"{scheme}: HTTP {answer.status_code} from /v2/")
    error = "; ".join(errors)[:300]
    return {"registry": registry, "reachable": False, "error": error, "checked_at": time.time()}


def _short(exc: Exception) -> str:
    """The root of a requests error in its own words (`Failed to establish a new connection:
    [Errno 111] Connection refused`), not urllib3's wrapping of it (pool, object address)."""
    inner = exc.args[0] if exc.args and isinstance(exc.args[0], Exception) else exc
    inner = getattr(inner, "reason", None) or inner
    if isinstance(inner, Exception) and len(inner.args) > 1 and isinstance(inner.args[-1], str):
        return inner.args[-1]  # urllib3's (connection, message) errors: a timeout
    text = str(inner)
    return text.rpartition(">: ")[2] or text


class RegistryProbe:
    """The registries to check, and the last answer of each (see the module's docstring);
    `start()` runs the checks in a thread of their own."""

    def __init__(self, get: Callable = requests.get, interval: float = PROBE_SECONDS):
        self.get = get
        self.interval = interval
        self.wanted: list[str] = []
        self.results: dict[str, dict] = {}
        self._lock = threading.Lock()
        self._changed = threading.Event()

    def want(self, registries: Iterable[str]) -> None:
        """Check these registries from now on (others are forgotten); new ones at once."""
        wanted = sorted({name for name in registries if name and name != "localhost"})
        wanted = wanted[:MAX_REGISTRIES]
        with self._lock:
            if wanted == self.wanted:
                return
            self.wanted = wanted
            self.results = {name: self.results[name] for name in wanted if name in self.results}
        self._changed.set()

    def start(self) -> None:
        threading.Thread(target=self._loop, name="registry-probe", daemon=True).start()

    def probe_due(self) -> None:
        """Check each registry not checked within the interval."""
        now = time.time()
        with self._lock:
            due = [
                name
                for name in self.wanted
                if now - self.results.get(name, {}).get("checked_at", 0.0) >= self.interval
            ]
        for name in due:
            found = check(name, self.get)
            if not found["reachable"]:
                log.warning("registry %s cannot be reached: %s", name, found["error"])
            with self._lock:
                if name in self.wanted:
                    self.results[name] = found

    def report(self) -> list[dict]:
        """The inventory's `registries`: each registry checked so far, by name."""
        with self._lock:
            return [dict(self.results[name]) for name in self.wanted if name in self.results]

    def _loop(self) -> None:
        while True:
            try:
                self.probe_due()
            except Exception:  # a bug here must not end the checks for good
                log.exception("the registry checks failed")
            self._changed.wait(self.interval)
            self._changed.clear()
