"""The only code that speaks HTTP (and websockets) to host agents."""

import asyncio
import os
import weakref
from collections.abc import AsyncIterator
from typing import Any

import httpx
from django.conf import settings

from console.fleet.models import Host


class AgentError(Exception):
    """A call to an agent failed. `transient` errors are worth retrying."""

    transient = False

    def __init__(self, host: Host | str, message: str, status: int | None = None, code: str = ""):
        self.host_name = host if isinstance(host, str) else host.name
        self.message = message
        self.status = status
        self.code = code
        super().__init__(f"{self.host_name}: {message}")

    def __reduce__(self):
        # Celery pickles task errors: rebuild from plain values, not the Host row.
        return (self.__class__, (self.host_name, self.message, self.status, self.code))


class AgentUnavailable(AgentError):
    """The agent did not answer, timed out, or failed on its side (5xx)."""

    transient = True


class AgentRejected(AgentError):
    """The agent refused the request (4xx): retrying the same call will not help."""


_clients: dict[int, httpx.Client] = {}


def _client() -> httpx.Client:
    """One client per process, so calls reuse kept-alive connections (a fresh client costs a
    TLS context and a connection: ~20-40 ms, against ~1.5 ms on a warm one). Keyed by pid
    because Celery's prefork workers must not share a parent's sockets."""
    client = _clients.get(os.getpid())
    if client is None:
        client = _clients[os.getpid()] = httpx.Client()
    return client


def _request(host: Host, method: str, path: str, json: Any = None) -> httpx.Response:
    try:
        response = _client().request(
            method,
            host.address.rstrip("/") + path,
            json=json,
            headers={"Authorization": f"Bearer {host.secret}"},
            timeout=settings.AGENT_TIMEOUT_SECONDS,
        )
    except httpx.HTTPError as exc:
        raise AgentUnavailable(host, f"{method} {path}: {exc.__class__.__name__}: {exc}") from exc
    if response.status_code >= 500:
        raise AgentUnavailable(
            host, f"{method} {path}: HTTP {response.status_code}", response.status_code
        )
    if response.status_code >= 400 and not (method == "DELETE" and response.status_code == 404):
        try:
            body = response.json()
        except ValueError:
            body = {}
        raise AgentRejected(
            host,
            f"{method} {path}: {body.get('detail') or response.text[:200]}",
            response.status_code,
            body.get("error", ""),
        )
    return response


def inventory(host: Host) -> dict:
    return _request(host, "GET", "/v1/inventory").json()


def list_allocations(host: Host) -> list[dict]:
    return _request(host, "GET", "/v1/allocations").json()["allocations"]


def create_allocation(host: Host, allocation_id: str, body: dict) -> dict:
    """Idempotent: the same id and body give the same allocation."""
    return _request(host, "PUT", f"/v1/allocations/{allocation_id}", body).json()


def allocation_action(host: Host, allocation_id: str, action: str) -> dict:
    if action not in ("stop", "start", "reboot"):
        raise ValueError(f"unknown allocation action {action!r}")
    return _request(host, "POST", f"/v1/allocations/{allocation_id}/{action}").json()


def delete_allocation(host: Host, allocation_id: str) -> None:
    """Idempotent: deleting an allocation the agent does not know is fine."""
    _request(host, "DELETE", f"/v1/allocations/{allocation_id}")


def instance_logs(host: Host, instance_pk: int, tail: int) -> list[str]:
    """The last `tail` lines of the instance's workload output on that host, oldest first
    (also of its earlier runs there; none for an instance the host does not know)."""
    return _request(host, "GET", f"/v1/instances/{instance_pk}/logs?tail={tail}").json()["lines"]


def delete_instance_data(host: Host, instance_pk: int) -> None:
    """Remove the instance's disk (volume) and kept logs from the host. Idempotent; the
    agent refuses (409 instance_busy) while an allocation of the instance is still there."""
    _request(host, "DELETE", f"/v1/instances/{instance_pk}")


def inject_fault(host: Host, gpu_index: int, fault: str) -> None:
    """Simulated hosts only: make a GPU fail (xid79, ecc) or heal (clear)."""
    _request(host, "POST", "/v1/sim/faults", {"gpu": gpu_index, "fault": fault})


def set_gpu_mode(host: Host, gpu_index: int, mode: str) -> dict:
    """Repartition a GPU (whole, mig, shared) that holds no allocation; answers the GPU's
    inventory entry. The agent refuses (409) while an allocation sits on the GPU."""
    return _request(host, "PUT", f"/v1/gpus/{gpu_index}/mode", {"mode": mode}).json()


def set_ssh_keys(host: Host, instance_pk: int, keys: list[dict]) -> dict:
    """Replace the keys that open the instance's shells on that host (idempotent; an empty
    list lets no one in). Each key: {"name", "fingerprint", "public_key"}."""
    return _request(host, "PUT", f"/v1/instances/{instance_pk}/ssh-keys", {"keys": keys}).json()


# --- streams: the browser terminal and the instances' web ports (asyncio) -----------------


def _ws_base(host: Host) -> str:
    base = host.address.rstrip("/")
    return (
        "wss://" + base[len("https://") :]
        if base.startswith("https://")
        else ("ws://" + base.removeprefix("http://"))
    )


def _auth(host: Host) -> dict[str, str]:
    return {"Authorization": f"Bearer {host.secret}"}


def connect_terminal(host: Host, instance_pk: int, cols: int, rows: int):
    """The agent's terminal websocket of the instance (use with `async with`): binary frames
    carry the terminal's bytes, a text frame {"type": "resize", "cols", "rows"} resizes."""
    from websockets.asyncio.client import connect

    url = f"{_ws_base(host)}/v1/instances/{instance_pk}/terminal?cols={cols}&rows={rows}"
    return connect(
        url,
        additional_headers=_auth(host),
        open_timeout=settings.AGENT_TIMEOUT_SECONDS,
        max_size=None,
        compression=None,
    )


def connect_port_websocket(
    host: Host, instance_pk: int, port: int, path: str, subprotocols: list[str]
):
    """A websocket to the instance's container port through its agent (`async with`)."""
    from websockets.asyncio.client import connect
    from websockets.typing import Subprotocol

    url = f"{_ws_base(host)}{_port_path(instance_pk, port, path)}"
    return connect(
        url,
        additional_headers=_auth(host),
        subprotocols=[Subprotocol(p) for p in subprotocols] or None,
        open_timeout=settings.AGENT_TIMEOUT_SECONDS,
        max_size=None,
        compression=None,
    )


def _port_path(instance_pk: int, port: int, path: str) -> str:
    return f"/v1/instances/{instance_pk}/ports/{port}/{path}"


# One client per event loop (an ASGI server runs one): kept-alive connections to the agents.
_async_clients: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


async def port_request(
    host: Host,
    instance_pk: int,
    port: int,
    path: str,
    *,
    method: str,
    headers: list[tuple[str, str]],
    content: AsyncIterator[bytes] | bytes,
) -> httpx.Response:
    """Send a request to the instance's container port through its agent and answer its
    response as soon as its head arrives (stream the body with `aiter_raw()`, then
    `aclose()`). The request body `content` is streamed too. `headers` must not carry the
    console's cookies or Authorization: the agent's bearer secret is added here.
    AgentUnavailable when the agent does not answer."""
    loop = asyncio.get_running_loop()
    client = _async_clients.get(loop)
    if client is None:
        client = _async_clients[loop] = httpx.AsyncClient(
            timeout=httpx.Timeout(settings.AGENT_TIMEOUT_SECONDS, read=None, write=None)
        )
    request = client.build_request(
        method,
        host.address.rstrip("/") + _port_path(instance_pk, port, path),
        headers=[*headers, *_auth(host).items()],
        content=content,
    )
    try:
        return await client.send(request, stream=True)
    except httpx.HTTPError as exc:
        raise AgentUnavailable(host, f"{method} port {port}: {exc.__class__.__name__}") from exc
