"""The instances' web ports (Jupyter, TensorBoard, an app), reached through the agent and never
through a port opened on the host: HTTP requests and websockets are forwarded to the
container's own address, streamed both ways.

The path after /ports/{port}/ is data for the container's server: each segment is
percent-encoded again (a `..` goes on as `%2E%2E`), so nothing in it is resolved here.

The container's server sees the Host the browser named (the port's origin, which the console
sends as X-Forwarded-Host; only a plain host[:port] is taken), as behind any reverse proxy,
so that an app comparing Origin with Host (Jupyter) takes the browser's requests and
websockets. A websocket carries the browser's Origin, the app's cookies and the subprotocols
it offers on, and is accepted with the one the container's server chose."""

import asyncio
import contextlib
import re
import string
from urllib.parse import quote

import httpx
import websockets
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.typing import Subprotocol

from agent.errors import ApiError
from agent.shell import until_either_ends

# hop-by-hop headers (RFC 9110 7.6.1) and what the agent's own API uses stay on this side
DROPPED_HEADERS = frozenset(
    {
        "authorization",
        "connection",
        "host",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "x-forwarded-host",
    }
)
# what a websocket carries on to the container's server (the console sent the app's cookies)
SOCKET_HEADERS = ("cookie", "origin", "x-forwarded-proto")
CONNECT_SECONDS = 5.0
SEGMENT_SAFE = "!$&'()*+,;=:@"  # RFC 3986 sub-delims, ':' and '@': valid in a path segment
QUERY_SAFE = string.punctuation.replace("#", "")  # the query as sent, but what no URL may hold
_PLAIN_HOST = re.compile(r"[a-z0-9]([a-z0-9.-]{0,252})(:[0-9]{1,5})?", re.IGNORECASE)


def forwarded_host(headers) -> str | None:
    """The console's X-Forwarded-Host (the port origin's host) when it is a plain
    host[:port], else None."""
    value = headers.get("x-forwarded-host", "")
    return value if _PLAIN_HOST.fullmatch(value) else None


def container_target(path: str, query: bytes) -> str:
    """The request target on the container's server: the route's (decoded) `path`, each
    segment encoded again, dot-segments included, and the query as the client sent it."""
    segments = (
        quote(segment, safe=SEGMENT_SAFE) if segment.strip(".") else segment.replace(".", "%2E")
        for segment in path.split("/")
    )
    target = "/" + "/".join(segments)
    return f"{target}?{quote(query, safe=QUERY_SAFE)}" if query else target


class PortProxy:
    def __init__(self, host):
        self.host = host

    async def _address(self, instance: str, port: int) -> str:
        if not 1 <= port <= 65535:
            raise ApiError(400, "invalid_port", f"port must be between 1 and 65535, not {port}")
        alloc = self.host.running_allocation(instance)
        runtime = self.host.runtime
        container = await asyncio.to_thread(runtime.running_container, alloc)
        address = container and runtime.container_address(container)
        if not address:
            raise ApiError(404, "not_running", f"instance {instance} has no reachable container")
        return f"{address}:{port}"

    async def http(self, request: Request) -> StreamingResponse | JSONResponse:
        params = request.path_params
        target = await self._address(params["instance"], params["port"])
        url = httpx.URL(f"http://{target}").copy_with(
            raw_path=container_target(params["path"], request.scope["query_string"]).encode()
        )
        headers = [(k, v) for k, v in request.headers.items() if k not in DROPPED_HEADERS]
        host = forwarded_host(request.headers)
        if host:
            headers += [("host", host), ("x-forwarded-host", host)]
        # a client per request: a container's server is reached once per browser request
        client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=CONNECT_SECONDS))
        outgoing = client.build_request(
            request.method,
            url,
            headers=headers,
            content=request.stream(),
        )
        try:
            answer = await client.send(outgoing, stream=True)
        except httpx.HTTPError as exc:
            await client.aclose()
            return JSONResponse(
                {"error": "port_unreachable", "detail": f"nothing answers on {target}: {exc}"},
                status_code=502,
            )
        response = StreamingResponse(
            answer.aiter_raw(),
            status_code=answer.status_code,
            background=BackgroundTask(_close, answer, client),
        )
        # each header as the app sent it: two Set-Cookie headers stay two, never one joined line
        response.raw_headers = [
            (name, value)
            for name, value in answer.headers.raw
            if name.decode("latin-1").lower() not in DROPPED_HEADERS
        ]
        return response

    async def websocket(self, ws: WebSocket) -> None:
        params = ws.path_params
        try:
            target = await self._address(params["instance"], params["port"])
        except ApiError as exc:
            await ws.close(4404 if exc.status == 404 else 4400)
            return
        path = container_target(params["path"], ws.scope["query_string"])
        address, _, port = target.rpartition(":")
        # the URL names the browser's Host; the connection goes to the container's address
        host = forwarded_host(ws.headers) or target
        headers = [(k, v) for k, v in ws.headers.items() if k in SOCKET_HEADERS]
        try:
            upstream = await websockets.connect(
                f"ws://{host}{path}",
                host=address,
                port=int(port),
                additional_headers=headers,
                subprotocols=[Subprotocol(p) for p in ws.scope.get("subprotocols") or []] or None,
                proxy=None,
                open_timeout=CONNECT_SECONDS,
            )
        except (OSError, websockets.WebSocketException, TimeoutError):
            await ws.close(4502)
            return
        await ws.accept(subprotocol=upstream.subprotocol)
        await relay(ws, upstream)


async def _close(answer: httpx.Response, client: httpx.AsyncClient) -> None:
    await answer.aclose()
    await client.aclose()


async def relay(ws: WebSocket, upstream) -> None:
    """Frames both ways until either side closes."""

    async def down() -> None:
        async for message in upstream:
            if isinstance(message, bytes):
                await ws.send_bytes(message)
            else:
                await ws.send_text(message)

    async def up() -> None:
        with contextlib.suppress(WebSocketDisconnect):
            while True:
                message = await ws.receive()
                if message["type"] == "websocket.disconnect":
                    return
                data = message.get("bytes")
                await upstream.send(data if data is not None else message.get("text", ""))

    await until_either_ends(down(), up())
    await upstream.close()
    with contextlib.suppress(RuntimeError):
        await ws.close()
