"""The agent's HTTP API: inventory, allocations, instances' logs and volumes, tenants'
volumes (kept, deleted), images (pre-pull and mirror settings, clean-up:
agent/image_store.py), volumes' snapshot jobs (agent/snapshots.py), GPU modes and (sim
backend) fault injection, and the data plane a tenant's requests pass through: the instances'
web ports and terminals.

Two planes, two credentials, checked on the route a request matched:
- control routes take only `Authorization: Bearer <host secret>` (the one the console handed
  last, or the one before while its grace lasts: agent/identity.py);
- data-plane routes (ports, terminal) take only `Authorization: Grant <grant>` (agent/grants.py)
  whose scope names that route's instance and port: never the host secret.
/v1/healthz is open. A refusal is 401 (a websocket is closed 4401 before it opens). JSON in and
out; errors are `{"error": code, "detail": text}`.
"""

import contextlib
import json

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from agent import grants, integers
from agent.backends.sim import FAULTS
from agent.errors import ApiError, invalid
from agent.host import LocalHost
from agent.identity import HostSecret
from agent.ports import PortProxy
from agent.shell import Shell, until_either_ends
from agent.snapshots import SnapshotJobs
from agent.ssh import parse_keys
from agent.terminals import MEMBER, SESSION_KEY, WITHDRAWN, Terminals, parse_members

PORT_PATH = "/v1/instances/{instance}/ports/{port:int}/{path:path}"
PROXIED_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
MAX_TERMINAL = 1000  # columns or rows
HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


def error_response(status: int, code: str, detail: str, headers=None) -> JSONResponse:
    return JSONResponse({"error": code, "detail": detail}, status_code=status, headers=headers)


def _credential(connection: HTTPConnection, scheme: str) -> str | None:
    """The token of the request's Authorization header if it is of `scheme`."""
    given, _, token = connection.headers.get("authorization", "").partition(" ")
    return token.strip() if given.lower() == scheme else None


async def _refuse(connection: HTTPConnection, scheme: str, detail: str) -> Response | None:
    if isinstance(connection, WebSocket):
        await connection.close(4401)
        return None
    return error_response(401, "unauthorized", detail, {"WWW-Authenticate": scheme.title()})


class Planes:
    """Wraps each route's endpoint in the check of its plane's credential: the host secret as
    it is now (agent/identity.py), and the one before it while its grace lasts."""

    def __init__(self, secret: HostSecret):
        self.secret = secret

    def control(self, endpoint):
        async def guarded(request: Request) -> Response:
            token = _credential(request, "bearer")
            if token is None or not self.secret.accepts(token):
                return await _refuse(
                    request, "bearer", "this call needs 'Authorization: Bearer <host secret>'"
                )
            return await endpoint(request)

        return guarded

    def granted(self, kind: str, endpoint):
        """A data-plane endpoint: its grant must name `kind` and the route's instance (and
        port), as parsed by the router."""

        async def guarded(connection):
            params = connection.path_params
            scope = (kind, params["instance"], *([params["port"]] if kind == "port" else []))
            token = _credential(connection, "grant")
            if token is None or not any(
                grants.valid(key, scope, token) for key in self.secret.data_keys()
            ):
                return await _refuse(
                    connection,
                    "grant",
                    f"this call needs 'Authorization: Grant <grant>' of its {kind}",
                )
            return await endpoint(connection)

        return guarded


async def _json_body(request: Request):
    try:
        return json.loads(await request.body())
    except ValueError as exc:
        raise invalid(f"the body is not JSON: {exc}", "invalid_json") from exc


async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
    return error_response(exc.status, exc.code, exc.detail)


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    return error_response(
        exc.status_code, HTTP_CODES.get(exc.status_code, "http_error"), exc.detail
    )


def create_app(host: LocalHost, secret: HostSecret, lifespan=None) -> Starlette:
    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    async def inventory(request: Request) -> JSONResponse:
        await host.refresh_images()  # asked for: as the engine holds them now
        return JSONResponse(host.inventory())

    async def allocations(request: Request) -> JSONResponse:
        return JSONResponse({"allocations": host.views()})

    async def put_allocation(request: Request) -> JSONResponse:
        alloc_id = request.path_params["alloc_id"]
        created, alloc = await host.put(alloc_id, await _json_body(request))
        return JSONResponse(alloc.view(), status_code=201 if created else 200)

    async def put_limits(request: Request) -> JSONResponse:
        alloc = await host.set_limits(request.path_params["alloc_id"], await _json_body(request))
        return JSONResponse(alloc.view())

    async def delete_allocation(request: Request) -> Response:
        await host.delete(request.path_params["alloc_id"])
        return Response(status_code=204)

    def action(operation):
        async def endpoint(request: Request) -> JSONResponse:
            alloc = await operation(request.path_params["alloc_id"])
            return JSONResponse(alloc.view())

        return endpoint

    async def instance_logs(request: Request) -> JSONResponse:
        instance = request.path_params["instance"]
        try:
            tail = integers.parse(request.query_params.get("tail", "100"), minimum=1)
        except integers.NotAWholeNumber as error:
            raise invalid(f"tail: {error}") from None
        lines = await host.logs(instance, tail)
        return JSONResponse({"instance": instance, "lines": lines})

    async def delete_instance(request: Request) -> Response:
        await host.delete_instance(request.path_params["instance"])
        return Response(status_code=204)

    async def adopt_volume(request: Request) -> Response:
        await host.adopt_volume(request.path_params["name"], await _json_body(request))
        return Response(status_code=204)

    async def delete_volume(request: Request) -> Response:
        query = request.query_params
        name = request.path_params["name"]
        await host.delete_volume(name, query.get("owner", ""), query.get("tenant", ""))
        return Response(status_code=204)

    async def put_ssh_keys(request: Request) -> JSONResponse:
        instance = request.path_params["instance"]
        body = await _json_body(request)
        keys = parse_keys(body)
        host.set_ssh_keys(instance, keys, parse_members(body))
        return JSONResponse({"instance": instance, "keys": len(keys)})

    async def put_host_certificate(request: Request) -> JSONResponse:
        if host.gateway is None:
            raise ApiError(404, "no_gateway", "this agent runs no SSH gateway")
        return JSONResponse(host.gateway.certify(await _json_body(request)))

    async def set_mode(request: Request) -> JSONResponse:
        body = await _json_body(request)
        if not isinstance(body, dict) or set(body) != {"mode"}:
            raise invalid('the body must be {"mode": "whole" | "mig" | "shared"}')
        return JSONResponse(host.set_mode(request.path_params["index"], body["mode"]))

    async def inject_fault(request: Request) -> JSONResponse:
        body = await _json_body(request)
        if not isinstance(body, dict) or set(body) != {"gpu", "fault"}:
            raise invalid('the body must be {"gpu": INDEX, "fault": "xid79" | "ecc" | "clear"}')
        gpus = host.backend.gpus()
        index, fault = body["gpu"], body["fault"]
        if type(index) is not int or not 0 <= index < len(gpus):
            raise invalid(f"no GPU {index!r} on this host ({len(gpus)} GPUs)", "unknown_gpu")
        if fault not in FAULTS:
            raise invalid(f"fault must be one of {', '.join(FAULTS)}, not {fault!r}")
        host.backend.inject(index, fault)
        host.poll()
        return JSONResponse(host.backend.gpus()[index])

    async def put_image_settings(request: Request) -> JSONResponse:
        return JSONResponse(host.configure_images(await _json_body(request)))

    async def clean_up_images(request: Request) -> JSONResponse:
        return JSONResponse(await host.clean_up_images())

    snapshot_jobs = SnapshotJobs(getattr(host.runtime, "disks", None), host.store.root)

    async def put_snapshot_job(request: Request) -> JSONResponse:
        body = await _json_body(request)
        created, job = snapshot_jobs.start(request.path_params["job"], body)
        return JSONResponse(job.view(), status_code=202 if created else 200)

    async def snapshot_job(request: Request) -> JSONResponse:
        return JSONResponse(snapshot_jobs.get(request.path_params["job"]).view())

    async def put_secret(request: Request) -> JSONResponse:
        return JSONResponse(secret.rotate(await _json_body(request)))

    proxy = PortProxy(host)
    planes = Planes(secret)
    control = planes.control
    routes = [
        Route("/v1/healthz", healthz, methods=["GET"]),
        Route("/v1/inventory", control(inventory), methods=["GET"]),
        Route("/v1/allocations", control(allocations), methods=["GET"]),
        Route("/v1/allocations/{alloc_id}", control(put_allocation), methods=["PUT"]),
        Route("/v1/allocations/{alloc_id}", control(delete_allocation), methods=["DELETE"]),
        Route("/v1/allocations/{alloc_id}/limits", control(put_limits), methods=["PUT"]),
        Route("/v1/allocations/{alloc_id}/stop", control(action(host.stop)), methods=["POST"]),
        Route("/v1/allocations/{alloc_id}/start", control(action(host.start)), methods=["POST"]),
        Route("/v1/allocations/{alloc_id}/reboot", control(action(host.reboot)), methods=["POST"]),
        Route("/v1/instances/{instance}/logs", control(instance_logs), methods=["GET"]),
        Route("/v1/instances/{instance}", control(delete_instance), methods=["DELETE"]),
        Route("/v1/instances/{instance}/ssh-keys", control(put_ssh_keys), methods=["PUT"]),
        Route("/v1/identity/secret", control(put_secret), methods=["PUT"]),
        Route("/v1/ssh/host-certificate", control(put_host_certificate), methods=["PUT"]),
        Route("/v1/gpus/{index:int}/mode", control(set_mode), methods=["PUT"]),
        Route("/v1/volumes/{name}/owner", control(adopt_volume), methods=["PUT"]),
        Route("/v1/volumes/{name}", control(delete_volume), methods=["DELETE"]),
        Route("/v1/images/settings", control(put_image_settings), methods=["PUT"]),
        Route("/v1/images/clean-up", control(clean_up_images), methods=["POST"]),
        Route("/v1/snapshot-jobs/{job}", control(put_snapshot_job), methods=["PUT"]),
        Route("/v1/snapshot-jobs/{job}", control(snapshot_job), methods=["GET"]),
        WebSocketRoute(
            "/v1/instances/{instance}/terminal", planes.granted("terminal", terminal(host))
        ),
        Route(PORT_PATH, planes.granted("port", proxy.http), methods=list(PROXIED_METHODS)),
        WebSocketRoute(PORT_PATH, planes.granted("port", proxy.websocket)),
    ]
    if host.backend.name == "sim":
        routes.append(Route("/v1/sim/faults", control(inject_fault), methods=["POST"]))
    return Starlette(
        routes=routes,
        exception_handlers={ApiError: _api_error, HTTPException: _http_error},
        lifespan=lifespan,
    )


def terminal(host: LocalHost):
    """`/v1/instances/{id}/terminal?cols=&rows=[&session=][&member=]`: a login shell in the
    instance's container with a PTY. Binary frames carry the terminal's bytes both ways; a text
    frame `{"type": "resize", "cols", "rows"}` resizes. Closes 1000 when the shell ends, 4403
    when its member's access went, 4404 when the instance is not running here, 4503 when its
    processes could not be tracked (agent/sessions.py), 4400 for a bad query. With a session
    key the shell is kept a while when the console goes without closing it, and the same key
    takes it back (agent/terminals.py): the upgrade's `X-Terminal: resumed` header says so."""
    terminals = Terminals(ended=lambda instance, message: host.session_event(instance, message))
    host.key_listeners.append(terminals.withdraw)

    async def endpoint(ws: WebSocket) -> None:
        instance = ws.path_params["instance"]
        try:
            cols, rows = (
                integers.parse(ws.query_params.get(k, d), minimum=1, maximum=MAX_TERMINAL)
                for k, d in (("cols", "80"), ("rows", "24"))
            )
        except integers.NotAWholeNumber:
            cols = rows = 0
        key = ws.query_params.get("session")
        member = ws.query_params.get("member")
        if (
            not (cols and rows)
            or (key is not None and not SESSION_KEY.fullmatch(key))
            or (member is not None and not MEMBER.fullmatch(member))
        ):
            await ws.accept()
            await ws.close(4400)
            return
        kept = await terminals.take(instance, key) if key else None
        if kept is not None:
            shell, backlog = kept
            await ws.accept(headers=[(b"x-terminal", b"resumed")])
            await shell.resize(cols, rows)
            if backlog:
                try:
                    await ws.send_bytes(backlog)
                except WebSocketDisconnect:  # the tab went again at once: the shell waits on
                    terminals.keep(instance, key, shell, member)
                    return
        else:
            await ws.accept(headers=[(b"x-terminal", b"new")])
            try:
                shell = await Shell.open(host, instance, cols=cols, rows=rows)
            except ApiError as exc:
                with contextlib.suppress(WebSocketDisconnect):  # the tab may be gone already
                    await ws.close(4000 + exc.status)  # 4404, 4409, 4503 (untracked)
                return
        terminals.open[shell] = (instance, member)
        try:
            gone = await _pump(ws, shell)
        finally:
            terminals.open.pop(shell, None)
        if key and gone is not None and gone != 1000 and not shell.withdrawn:
            terminals.keep(instance, key, shell, member)
        else:
            shell.close()

    return endpoint


async def _pump(ws: WebSocket, shell: Shell) -> int | None:
    """Relay until the shell's output ends (None) or the client goes (its close code); the
    shell stays open for the caller to end or keep."""
    gone, ended = [], []

    async def keys() -> None:
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                gone.append(message.get("code") or 1006)
                return
            if message.get("bytes") is not None:
                await shell.write(message["bytes"])
            elif message.get("text"):
                resize = _resize(message["text"])
                if resize:
                    await shell.resize(*resize)

    async def screen() -> None:
        while (chunk := await shell.read()) is not None:
            await ws.send_bytes(chunk[1])
        ended.append(True)

    await until_either_ends(keys(), screen())
    if ended:
        with contextlib.suppress(RuntimeError, WebSocketDisconnect):  # the client went meanwhile
            await ws.close(WITHDRAWN if shell.withdrawn else 1000)
        return None
    return gone[0] if gone else 1006  # a send that failed: the client went without a word


def _resize(text: str) -> tuple[int, int] | None:
    try:
        frame = json.loads(text)
        cols, rows = (
            integers.json_int(frame[k], minimum=1, maximum=MAX_TERMINAL) for k in ("cols", "rows")
        )
    except (ValueError, KeyError, TypeError):
        return None
    return (cols, rows) if frame.get("type") == "resize" else None
