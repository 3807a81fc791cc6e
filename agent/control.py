"""The agent protocol with the control plane, client side.

- `POST {server}/agent/v1/register` once, with a join token, to get the host id and secret;
- `POST {server}/agent/v1/heartbeat` every heartbeat interval with the API's address,
  inventory and allocations;
- `POST {server}/agent/v1/samples` with each round of samples as soon as it is read (the
  rounds read while the console is away are buffered and sent when it is back);
- `POST {server}/agent/v1/events` as soon as something happens to a workload that the console
  did not ask for (it exited, failed, a slow launch ended, an image pull progressed).
Each carries `Authorization: Bearer <secret>`.
"""

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque

import httpx

from agent import AGENT_VERSION
from agent.host import Host
from agent.state import StateStore

log = logging.getLogger(__name__)

REGISTER_PATH = "/agent/v1/register"
HEARTBEAT_PATH = "/agent/v1/heartbeat"
SAMPLES_PATH = "/agent/v1/samples"
EVENTS_PATH = "/agent/v1/events"
BUFFER_EVENTS = 1000  # events kept while the server is away
TIMEOUT_SECONDS = 10.0
PUSH_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 30.0
BUFFER_ROUNDS = 300  # sample rounds (one sample per GPU each) kept while the server is away
ROUNDS_PER_POST = 60
FLUSH_SECONDS = 2.0  # at shutdown, how long the last push of buffered samples may take
# answers that say a batch will never be taken: drop it rather than block the ones after it
REJECTED = (400, 413, 422)


class RegistrationError(Exception):
    pass


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:200] or response.reason_phrase
    if isinstance(body, dict):
        return str(body.get("detail") or body.get("error") or body)
    return str(body)


def _identity_answer(server: str, response: httpx.Response) -> dict:
    try:
        answer = response.json()
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or type(answer.get("host_id")) is not int:
        raise RegistrationError(f"{server} answered without a host_id: {_message(response)}")
    if not isinstance(answer.get("secret"), str) or not answer["secret"]:
        raise RegistrationError(f"{server} answered without a secret")
    return answer


def register(server: str, payload: dict) -> dict:
    """Register until the server answers; a 4xx (a used or expired token…) is final."""
    delay = 1.0
    with httpx.Client(timeout=TIMEOUT_SECONDS) as client:
        while True:
            try:
                response = client.post(server + REGISTER_PATH, json=payload)
            except httpx.HTTPError as exc:
                log.warning("cannot reach %s: %s; retrying in %.0f s", server, exc, delay)
            else:
                if response.status_code in (200, 201):
                    return _identity_answer(server, response)
                if 400 <= response.status_code < 500:
                    raise RegistrationError(
                        f"registration refused by {server} (HTTP {response.status_code}): "
                        f"{_message(response)}"
                    )
                log.warning(
                    "registration: HTTP %d from %s; retrying in %.0f s",
                    response.status_code,
                    server,
                    delay,
                )
            time.sleep(delay)
            delay = min(MAX_BACKOFF_SECONDS, delay * 2)


def ensure_identity(
    store: StateStore,
    server: str,
    join_token: str | None,
    registration: dict,
) -> dict:
    """The identity from the state directory, or a new one from registering with `server`
    (`registration` holds hostname, address, region and inventory)."""
    identity = store.load_identity()
    if identity:
        if identity["server"] != server:
            raise RegistrationError(
                f"{store.root} holds the identity of a host of {identity['server']}; "
                "give that --server, or another --state-dir to register anew"
            )
        return identity
    if not join_token:
        raise RegistrationError(f"{store.root} holds no identity: --join-token is needed")
    answer = register(
        server, {"join_token": join_token, "agent_version": AGENT_VERSION, **registration}
    )
    identity = {
        "server": server,
        "host_id": answer["host_id"],
        "secret": answer["secret"],
        "heartbeat_interval": answer.get("heartbeat_interval"),
        "sample_interval": answer.get("sample_interval"),
    }
    store.save_identity(identity)
    log.info("registered with %s as host %d", server, identity["host_id"])
    return identity


class Reporter:
    """Heartbeats and sample pushes of a registered host."""

    def __init__(self, host: Host, identity: dict, heartbeat_interval: float, address: str):
        self.host = host
        self.address = address
        self.server = identity["server"]
        self.host_id = identity["host_id"]
        self.heartbeat_interval = heartbeat_interval
        self.client = httpx.AsyncClient(
            timeout=TIMEOUT_SECONDS, headers={"Authorization": f"Bearer {identity['secret']}"}
        )
        self._rounds: deque[tuple[int, list[dict]]] = deque(maxlen=BUFFER_ROUNDS)
        self._serial = itertools.count(1)
        self._failures = 0
        self._new_round = asyncio.Event()
        self._events: deque[dict] = deque(maxlen=BUFFER_EVENTS)
        self._new_event = asyncio.Event()
        self._event_failures = 0

    def add_event(self, event: dict) -> None:
        """Queue an event to send at once (the host's listener)."""
        self._events.append(event)
        self._new_event.set()

    async def push_events(self) -> None:
        """Wait for events, then send every one queued; on failure keep them (and back off:
        event_delay). The console handles an event sent twice as once."""
        while not self._events:
            self._new_event.clear()
            await self._new_event.wait()
        batch = list(self._events)
        payload = {"host_id": self.host_id, "events": batch}
        try:
            response = await self.client.post(self.server + EVENTS_PATH, json=payload)
        except httpx.HTTPError as exc:
            self._event_failures = min(self._event_failures + 1, 8)
            log.warning("events to %s failed: %s; %d kept", self.server, exc, len(batch))
            return
        if response.status_code in REJECTED:
            log.error(
                "events rejected, dropped: HTTP %d: %s", response.status_code, _message(response)
            )
        elif not response.is_success:
            self._event_failures = min(self._event_failures + 1, 8)
            log.warning("events: HTTP %d: %s", response.status_code, _message(response))
            return
        sent = {id(event) for event in batch}
        while self._events and id(self._events[0]) in sent:
            self._events.popleft()
        self._event_failures = 0

    def event_delay(self) -> float:
        return 0 if not self._event_failures else min(MAX_BACKOFF_SECONDS, 2**self._event_failures)

    def add(self, samples: list[dict]) -> None:
        """Buffer a round of samples (sent at once by push_when_read); beyond BUFFER_ROUNDS the
        oldest round is dropped."""
        self._rounds.append((next(self._serial), samples))
        self._new_round.set()

    async def round_read(self) -> None:
        """Wait until a round is buffered."""
        while not self._rounds:
            self._new_round.clear()
            await self._new_round.wait()

    async def push_when_read(self) -> None:
        """Wait for a round, then push everything buffered: a sample leaves as soon as it is
        read, not on a timer of the agent's own."""
        await self.round_read()
        await self.push()

    @property
    def backing_off(self) -> bool:
        """Whether the last push failed (the rounds stay buffered)."""
        return self._failures > 0

    async def heartbeat(self) -> None:
        inventory = self.host.inventory()
        payload = {
            "host_id": self.host_id,
            "agent_version": AGENT_VERSION,
            "address": self.address,  # where the API is now: it may move between restarts
            "inventory_digest": inventory["digest"],
            "inventory": inventory,
            "allocations": self.host.views(),
        }
        try:
            response = await self.client.post(self.server + HEARTBEAT_PATH, json=payload)
        except httpx.HTTPError as exc:
            log.warning("heartbeat to %s failed: %s", self.server, exc)
            return
        if not response.is_success:
            log.warning("heartbeat: HTTP %d: %s", response.status_code, _message(response))

    async def push(self) -> None:
        """Send the buffered samples, oldest first; on failure keep them and back off."""
        while self._rounds:
            batch = list(itertools.islice(self._rounds, ROUNDS_PER_POST))
            payload = {"host_id": self.host_id, "samples": [s for _, r in batch for s in r]}
            try:
                response = await self.client.post(self.server + SAMPLES_PATH, json=payload)
            except httpx.HTTPError as exc:
                self._failed(f"samples to {self.server} failed: {exc}")
                return
            if response.status_code in REJECTED:
                log.error(
                    "samples rejected, dropped: HTTP %d: %s",
                    response.status_code,
                    _message(response),
                )
            elif not response.is_success:
                self._failed(f"samples: HTTP {response.status_code}: {_message(response)}")
                return
            sent = batch[-1][0]
            while self._rounds and self._rounds[0][0] <= sent:
                self._rounds.popleft()
        self._failures = 0

    def _failed(self, message: str) -> None:
        self._failures = min(self._failures + 1, 8)
        log.warning("%s; %d rounds buffered", message, len(self._rounds))

    def push_delay(self) -> float:
        """No wait while the console takes samples; a growing one while it does not."""
        if not self._failures:
            return 0
        return min(MAX_BACKOFF_SECONDS, PUSH_SECONDS * 2**self._failures)

    async def flush(self) -> None:
        """At shutdown: one short try at sending the rounds still buffered, so a restart
        loses no samples when the server is there."""
        if self._rounds:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.push(), FLUSH_SECONDS)

    async def aclose(self) -> None:
        await self.client.aclose()
