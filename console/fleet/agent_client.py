"""The only code that speaks HTTP (and websockets) to host agents.

Two credentials, one per plane of the agent: the host secret (`Authorization: Bearer`) on the
control routes the console calls for itself (allocations, keys, inventory, logs, GPU modes);
on what a tenant's request passes through (a web port, the terminal) a grant minted here per
request (`Authorization: Grant`, agent/grants.py), which opens that instance's port or terminal
for GRANT_SECONDS and nothing else. Every path is built from ints and checked ids; a port's
path is data, each segment encoded again."""

import asyncio
import hashlib
import hmac
import json
import os
import re
import time
import unicodedata
import weakref
from collections.abc import AsyncIterator
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any
from urllib.parse import quote, unquote_to_bytes, urlencode

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


# The Celery options of a task whose agent call may find the host away for a while: retried
# with backoff while the agent does not answer, and acknowledged only once it ran.
RETRIED_WHILE_UNAVAILABLE = {
    "autoretry_for": (AgentUnavailable,),
    "retry_backoff": settings.INSTANCE_AGENT_RETRY_BACKOFF,
    "retry_backoff_max": settings.INSTANCE_AGENT_RETRY_BACKOFF_MAX,
    "max_retries": settings.INSTANCE_AGENT_MAX_RETRIES,
    "acks_late": True,
}


class AgentRejected(AgentError):
    """The agent refused the request (4xx): retrying the same call will not help."""


class PortPathRefused(ValueError):
    """A port's path or query that could name something else than a path on that port."""


GRANT_SECONDS = 60
GRANT_CONTEXT = b"gpucloud data plane"  # as agent/grants.py, which checks what is minted here
ALLOCATION_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
SEGMENT_SAFE = "!$&'()*+,;=:@"  # RFC 3986 sub-delims, ':' and '@': valid in a path segment


_clients: dict[int, httpx.Client] = {}
# The clients are shared by every tenant's requests: a cookie an app sets (a Jupyter login)
# must go back to that browser only, never be kept here and sent with someone else's request.
_NO_COOKIES = CookieJar(DefaultCookiePolicy(allowed_domains=[]))


def _client() -> httpx.Client:
    """One client per process, so calls reuse kept-alive connections (a fresh client costs a
    TLS context and a connection: ~20-40 ms, against ~1.5 ms on a warm one). Keyed by pid
    because Celery's prefork workers must not share a parent's sockets."""
    client = _clients.get(os.getpid())
    if client is None:
        client = _clients[os.getpid()] = httpx.Client(cookies=_NO_COOKIES)
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


def _number(value: int) -> int:
    if type(value) is not int or value < 0:
        raise ValueError(f"an agent path takes whole numbers here, not {value!r}")
    return value


def _hex(value: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{16,128}", value):
        raise ValueError(f"an agent query takes a hex key here, not {value!r}")
    return value


def _allocation(host: Host, allocation_id: str) -> str:
    """An allocation id as the agent accepts them; an id an agent reported may be anything."""
    if not isinstance(allocation_id, str) or not ALLOCATION_ID.fullmatch(allocation_id):
        raise AgentRejected(host, f"not an allocation id: {allocation_id!r}", code="invalid_id")
    return allocation_id


def create_allocation(host: Host, allocation_id: str, body: dict) -> dict:
    """Idempotent: the same id and body give the same allocation."""
    return _request(host, "PUT", f"/v1/allocations/{_allocation(host, allocation_id)}", body).json()


def allocation_action(host: Host, allocation_id: str, action: str) -> dict:
    if action not in ("stop", "start", "reboot"):
        raise ValueError(f"unknown allocation action {action!r}")
    path = f"/v1/allocations/{_allocation(host, allocation_id)}/{action}"
    return _request(host, "POST", path).json()


def set_limits(host: Host, allocation_id: str, limits: dict) -> dict:
    """A live resize: the running workload's CPU, memory and pids limits change in place.
    Idempotent."""
    path = f"/v1/allocations/{_allocation(host, allocation_id)}/limits"
    return _request(host, "PUT", path, {"resources": limits}).json()


def put_host_certificate(host: Host, certificate: str) -> dict:
    """The SSH gateway presents this host certificate from now on; answers its new `ssh`."""
    return _request(host, "PUT", "/v1/ssh/host-certificate", {"certificate": certificate}).json()


def put_image_settings(host: Host, settings_body: dict) -> dict:
    """The images to pre-pull and the registry mirror to pull through (idempotent); answers
    the settings the agent applies now."""
    return _request(host, "PUT", "/v1/images/settings", settings_body).json()


def clean_up_images(host: Host) -> dict:
    """Remove the images the agent pulled that no allocation uses and no pre-pull wants;
    answers {"removed": [reference], "kept": [{"references", "why"}], "freed_bytes"}."""
    return _request(host, "POST", "/v1/images/clean-up").json()


def delete_allocation(host: Host, allocation_id: str) -> None:
    """Idempotent: deleting an allocation the agent does not know is fine."""
    _request(host, "DELETE", f"/v1/allocations/{_allocation(host, allocation_id)}")


def instance_logs(host: Host, instance_pk: int, tail: int) -> list[str]:
    """The last `tail` lines of the instance's workload output on that host, oldest first
    (also of its earlier runs there; none for an instance the host does not know)."""
    path = f"/v1/instances/{_number(instance_pk)}/logs?tail={_number(tail)}"
    return _request(host, "GET", path).json()["lines"]


def delete_instance_data(host: Host, instance_pk: int) -> None:
    """Remove the instance's disk (volume) and kept logs from the host. Idempotent; the
    agent refuses (409 instance_busy) while an allocation of the instance is still there."""
    _request(host, "DELETE", f"/v1/instances/{_number(instance_pk)}")


def adopt_disk(host: Host, disk: str, instance_pk: int, owner: str, tenant_pk: int) -> None:
    """The instance's disk `disk` becomes `owner`'s (a volume kept at its terminate): the
    instance's delete leaves it. Idempotent."""
    body = {"instance": str(instance_pk), "owner": owner, "tenant": str(tenant_pk)}
    _request(host, "PUT", f"/v1/volumes/{_allocation(host, disk)}/owner", body)


def delete_volume(host: Host, disk: str, owner: str, tenant_pk: int) -> None:
    """Remove a volume's disk from its host. Idempotent; the agent refuses (409 volume_busy)
    while an allocation there mounts it."""
    query = urlencode({"owner": owner, "tenant": str(tenant_pk)})
    _request(host, "DELETE", f"/v1/volumes/{_allocation(host, disk)}?{query}")


def start_snapshot_job(host: Host, job_id: str, body: dict) -> dict:
    """Start a snapshot job (backup, restore or forget: agent/snapshots.py) under the
    console's id. Idempotent: the same id and body answer the job as it stands."""
    return _request(host, "PUT", f"/v1/snapshot-jobs/{_allocation(host, job_id)}", body).json()


def snapshot_job(host: Host, job_id: str) -> dict:
    """A snapshot job's progress (bytes done of total, ETA) and outcome; AgentRejected 404
    when the agent does not know it (it restarted meanwhile)."""
    return _request(host, "GET", f"/v1/snapshot-jobs/{_allocation(host, job_id)}").json()


def inject_fault(host: Host, gpu_index: int, fault: str) -> None:
    """Simulated hosts only: make a GPU fail (xid79, ecc) or heal (clear)."""
    _request(host, "POST", "/v1/sim/faults", {"gpu": gpu_index, "fault": fault})


def set_gpu_mode(host: Host, gpu_index: int, mode: str) -> dict:
    """Repartition a GPU (whole, mig, shared) that holds no allocation; answers the GPU's
    inventory entry. The agent refuses (409) while an allocation sits on the GPU."""
    return _request(host, "PUT", f"/v1/gpus/{_number(gpu_index)}/mode", {"mode": mode}).json()


def put_host_secret(host: Host, secret: str, grace_seconds: float) -> dict:
    """Hand the agent its new secret (console/fleet/identity.py), with the current one: it
    takes calls with the old one `grace_seconds` more (0: none, a revoke)."""
    body = {"secret": secret, "grace_seconds": grace_seconds}
    return _request(host, "PUT", "/v1/identity/secret", body).json()


def set_ssh_keys(host: Host, instance_pk: int, keys: list[dict], members: list[str]) -> dict:
    """Replace the keys that open the instance's shells on that host (idempotent; an empty
    list lets no one in), and name the members who may hold its terminals: the agent ends at
    once the open terminals of any other. Each key: {"name", "fingerprint", "public_key"}."""
    path = f"/v1/instances/{_number(instance_pk)}/ssh-keys"
    return _request(host, "PUT", path, {"keys": keys, "members": members}).json()


# --- streams: the browser terminal and the instances' web ports (asyncio) -----------------


def _ws_base(host: Host) -> str:
    base = host.address.rstrip("/")
    return (
        "wss://" + base[len("https://") :]
        if base.startswith("https://")
        else ("ws://" + base.removeprefix("http://"))
    )


def mint_grant(secret: str, scope: tuple, expires: int) -> str:
    """A grant of `scope` (("port", instance, port) or ("terminal", instance)) until
    `expires` (unix seconds), signed with a key derived from the host `secret`."""
    key = hmac.new(secret.encode(), GRANT_CONTEXT, hashlib.sha256).digest()
    message = json.dumps([*scope, expires], separators=(",", ":")).encode()
    return f"{expires}.{hmac.new(key, message, hashlib.sha256).hexdigest()}"


def _grant(host: Host, *scope) -> dict[str, str]:
    token = mint_grant(host.secret, scope, int(time.time()) + GRANT_SECONDS)
    return {"Authorization": f"Grant {token}"}


def port_target(instance_pk: int, port: int, path: str, query: str) -> str:
    """The agent's request target for `path` (the raw, percent-encoded path after
    /ports/{port}/, as the browser sent it) and `query` (raw) on the instance's port.
    PortPathRefused for a segment that decodes to '.' or '..' or holds a separator ('/',
    '\\') or a control character, and for a query with what no URL may hold; every segment
    is encoded again, so the target names exactly these segments under the port's route."""
    segments = []
    for raw in path.split("/"):
        data = unquote_to_bytes(raw)
        text = data.decode("utf-8", "surrogateescape")
        if text in (".", "..") or any(c in "/\\" or unicodedata.category(c) == "Cc" for c in text):
            raise PortPathRefused(f"the port path may not hold the segment {raw!r}")
        segments.append(quote(data, safe=SEGMENT_SAFE))
    if any(not 0x21 <= ord(c) <= 0x7E or c == "#" for c in query):
        raise PortPathRefused(f"the query holds what no URL may: {query!r}")
    if not 1 <= _number(port) <= 65535:
        raise ValueError(f"port must be between 1 and 65535, not {port}")
    target = f"/v1/instances/{_number(instance_pk)}/ports/{port}/" + "/".join(segments)
    return f"{target}?{query}" if query else target


def connect_terminal(
    host: Host, instance_pk: int, member: int, cols: int, rows: int, key: str | None = None
):
    """The agent's terminal websocket of the instance for a member (a membership's pk: the
    agent ends it once a push of the instance's keys no longer names them), used with `async
    with`: binary frames carry the terminal's bytes, a text frame {"type": "resize", "cols",
    "rows"} resizes. With a session key (hex) the agent keeps the shell when the socket drops,
    for the same key to take back."""
    from websockets.asyncio.client import connect

    pk = _number(instance_pk)
    url = (
        f"{_ws_base(host)}/v1/instances/{pk}/terminal?cols={_number(cols)}&rows={_number(rows)}"
        f"&member={_number(member)}"
    )
    if key is not None:
        url += f"&session={_hex(key)}"
    return connect(
        url,
        additional_headers=_grant(host, "terminal", str(pk)),
        open_timeout=settings.AGENT_TIMEOUT_SECONDS,
        max_size=None,
        compression=None,
    )


def connect_port_websocket(
    host: Host,
    instance_pk: int,
    port: int,
    path: str,
    query: str,
    subprotocols: list[str],
    headers: list[tuple[str, str]],
):
    """A websocket to the instance's container port through its agent (`async with`); `path`
    and `query` as port_target takes them (PortPathRefused). `headers` (the browser's Origin,
    the app's cookies, X-Forwarded-Host) go on; never the console's cookies."""
    from websockets.asyncio.client import connect
    from websockets.typing import Subprotocol

    target = port_target(instance_pk, port, path, query)
    return connect(
        _ws_base(host) + target,  # websockets sends the target as it is, unnormalized
        additional_headers=[*headers, *_grant(host, "port", str(instance_pk), port).items()],
        subprotocols=[Subprotocol(p) for p in subprotocols] or None,
        open_timeout=settings.AGENT_TIMEOUT_SECONDS,
        max_size=None,
        compression=None,
    )


# One client per event loop (an ASGI server runs one): kept-alive connections to the agents.
_async_clients: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


async def port_request(
    host: Host,
    instance_pk: int,
    port: int,
    path: str,
    *,
    query: str,
    method: str,
    headers: list[tuple[str, str]],
    content: AsyncIterator[bytes] | bytes,
) -> httpx.Response:
    """Send a request to the instance's container port through its agent and answer its
    response as soon as its head arrives (stream the body with `aiter_raw()`, then
    `aclose()`). `path` and `query` as port_target takes them (PortPathRefused). The request
    body `content` is streamed too. `headers` must not carry the console's cookies; an
    Authorization among them is dropped for the port's grant. AgentUnavailable when the
    agent does not answer."""
    base = httpx.URL(host.address)
    target = port_target(instance_pk, port, path, query)
    # the target as raw bytes: httpx resolves no dot-segment in it (there is none) nor else
    url = base.copy_with(raw_path=base.raw_path.rstrip(b"/") + target.encode())
    loop = asyncio.get_running_loop()
    client = _async_clients.get(loop)
    if client is None:
        client = _async_clients[loop] = httpx.AsyncClient(
            timeout=httpx.Timeout(settings.AGENT_TIMEOUT_SECONDS, read=None, write=None),
            cookies=_NO_COOKIES,
        )
    kept = [(k, v) for k, v in headers if k.lower() != "authorization"]
    request = client.build_request(
        method,
        url,
        headers=[*kept, *_grant(host, "port", str(instance_pk), port).items()],
        content=content,
    )
    try:
        return await client.send(request, stream=True)
    except httpx.HTTPError as exc:
        raise AgentUnavailable(host, f"{method} port {port}: {exc.__class__.__name__}") from exc
