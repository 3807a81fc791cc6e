"""The agent protocol with the control plane, client side.

- `POST {server}/agent/v1/register` once, with a join token, to get the host id and secret;
- `POST {server}/agent/v1/heartbeat` every heartbeat interval with the API's address,
  inventory and allocations, and whether its container engine answers (`engine`);
- each round of samples as soon as it is read, as a frame of the websocket
  `{server}/agent/v1/samples/stream` (agent/sample_stream.py), or as
  `POST {server}/agent/v1/samples` where the console has no stream (the rounds read while the
  console is away are buffered and sent when it is back);
- `POST {server}/agent/v1/events` as soon as something happens to a workload that the console
  did not ask for (it exited, failed, a slow launch ended, an image pull progressed).
Each carries `Authorization: Bearer <secret>`: the secret as it is now, which the console may
rotate (agent/identity.py).

The heartbeat says where the agent's API is, but that never moves the host: the console keeps
calling the address the host joined with (only its operator or a new join changes it).

`{server}` is one of the console's web processes (`--server` given several times): requests
stay with the one that answers and move to the next when it cannot be reached (Servers).
"""

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque

import httpx
import orjson

from agent import AGENT_VERSION
from agent.host import LocalHost
from agent.identity import HostSecret
from agent.sample_stream import SampleStream
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


class Servers:
    """The console's web processes (their base URLs), any of which takes an agent's requests.
    Requests stay with the one in use while it answers; one that cannot be reached (refused,
    reset, timed out) hands the request to the next, round robin, until each was tried once.
    An HTTP error answer is the console's answer, not a reason to move."""

    def __init__(self, urls: list[str]):
        if not urls:
            raise ValueError("at least one server URL")
        self.urls = [url.rstrip("/") for url in urls]
        self._current = 0

    @property
    def current(self) -> str:
        return self.urls[self._current]

    def _next(self, exc: httpx.TransportError) -> None:
        failed = self.current
        self._current = (self._current + 1) % len(self.urls)
        if len(self.urls) > 1:
            log.warning("cannot reach %s (%s); trying %s", failed, exc, self.current)

    def post(self, client: httpx.Client, path: str, **kwargs) -> httpx.Response:
        for attempt in range(len(self.urls)):
            try:
                return client.post(self.current + path, **kwargs)
            except httpx.TransportError as exc:
                self._next(exc)
                if attempt == len(self.urls) - 1:
                    raise

    async def apost(self, client: httpx.AsyncClient, path: str, **kwargs) -> httpx.Response:
        for attempt in range(len(self.urls)):
            try:
                return await client.post(self.current + path, **kwargs)
            except httpx.TransportError as exc:
                self._next(exc)
                if attempt == len(self.urls) - 1:
                    raise

    def __str__(self) -> str:
        return self.urls[0] if len(self.urls) == 1 else f"every server ({', '.join(self.urls)})"


def _answer(response: httpx.Response):
    """The JSON of an answer, or its text when it is not JSON."""
    try:
        return response.json()
    except ValueError:
        return response.text.strip()[:200] or response.reason_phrase


def _detail(answer) -> str:
    if isinstance(answer, dict):
        return str(answer.get("detail") or answer.get("error") or answer)
    return str(answer)


def _message(response: httpx.Response) -> str:
    return _detail(_answer(response))


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


def register(servers: Servers, payload: dict) -> tuple[str, dict]:
    """Register until one of the servers answers; a 4xx (a used or expired token…) is final.
    Answers the server that registered the host, and its answer."""
    delay = 1.0
    with httpx.Client(timeout=TIMEOUT_SECONDS) as client:
        while True:
            try:
                response = servers.post(client, REGISTER_PATH, json=payload)
            except httpx.HTTPError as exc:
                log.warning("cannot reach %s: %s; retrying in %.0f s", servers, exc, delay)
            else:
                server = servers.current
                if response.status_code in (200, 201):
                    return server, _identity_answer(server, response)
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
    servers: Servers,
    join_token: str | None,
    registration: dict,
) -> dict:
    """The identity from the state directory, or a new one from registering with one of
    `servers` (`registration` holds hostname, address, region and inventory)."""
    identity = store.load_identity()
    if identity:
        if identity["server"] not in servers.urls:
            raise RegistrationError(
                f"{store.root} holds the identity of a host of {identity['server']}; "
                "give that --server too, or another --state-dir to register anew"
            )
        return identity
    if not join_token:
        raise RegistrationError(f"{store.root} holds no identity: --join-token is needed")
    server, answer = register(
        servers, {"join_token": join_token, "agent_version": AGENT_VERSION, **registration}
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


class _Bearer(httpx.Auth):
    """The host secret as it is at each request."""

    def __init__(self, secret: HostSecret):
        self.secret = secret

    def auth_flow(self, request: httpx.Request):
        request.headers["Authorization"] = f"Bearer {self.secret.current}"
        yield request


class Reporter:
    """Heartbeats and sample pushes of a registered host."""

    def __init__(
        self,
        host: LocalHost,
        identity: dict,
        heartbeat_interval: float,
        address: str,
        servers: Servers | None = None,
        secret: HostSecret | None = None,
    ):
        """`servers`: the console's web processes (default: the one that registered it);
        `secret`: the host secret, which the console may rotate (default: the identity's)."""
        self.host = host
        self.address = address
        self.servers = servers or Servers([identity["server"]])
        self.host_id = identity["host_id"]
        self.heartbeat_interval = heartbeat_interval
        self.secret = secret or HostSecret(identity["secret"])
        self.client = httpx.AsyncClient(timeout=TIMEOUT_SECONDS, auth=_Bearer(self.secret))
        self.stream = SampleStream(lambda: self.secret.current, TIMEOUT_SECONDS)
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
            response = await self.servers.apost(self.client, EVENTS_PATH, json=payload)
        except httpx.HTTPError as exc:
            self._event_failures = min(self._event_failures + 1, 8)
            log.warning("events to %s failed: %s; %d kept", self.servers, exc, len(batch))
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
            "address": self.address,  # where the API is now: a change is the operator's to make
            "inventory_digest": inventory["digest"],
            "inventory": inventory,
            "allocations": self.host.views(),
        }
        engine = await self.host.engine()
        if engine is not None:  # whether the container engine answers (runtimes with one)
            payload["engine"] = engine
        try:
            response = await self.servers.apost(self.client, HEARTBEAT_PATH, json=payload)
        except httpx.HTTPError as exc:
            log.warning("heartbeat to %s failed: %s", self.servers, exc)
            return
        if not response.is_success:
            log.warning("heartbeat: HTTP %d: %s", response.status_code, _message(response))

    async def push(self) -> None:
        """Send the buffered samples, oldest first; on failure keep them and back off."""
        while self._rounds:
            batch = list(itertools.islice(self._rounds, ROUNDS_PER_POST))
            payload = {"host_id": self.host_id, "samples": [s for _, r in batch for s in r]}
            # a reading NVML could not give as a number (NaN) goes as null: no reading
            body = orjson.dumps(payload)
            answered = await self.stream.send(self.servers.current, body)
            if answered is None:
                try:
                    response = await self.servers.apost(
                        self.client,
                        SAMPLES_PATH,
                        content=body,
                        headers={"Content-Type": "application/json"},
                    )
                except httpx.HTTPError as exc:
                    self._failed(f"samples to {self.servers} failed: {exc}")
                    return
                answered = response.status_code, _answer(response)
            status, answer = answered
            if status in REJECTED:
                log.error("samples rejected, dropped: HTTP %d: %s", status, _detail(answer))
            elif not 200 <= status < 300:
                self._failed(f"samples: HTTP {status}: {_detail(answer)}")
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
        await self.stream.close()
        await self.client.aclose()
