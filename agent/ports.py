"""The instances' web ports (Jupyter, TensorBoard, an app), reached through the agent and never
through a port opened on the host: HTTP requests and websockets are forwarded to the
container's own address, streamed both ways."""

import asyncio
import contextlib

import httpx
import websockets
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.websockets import WebSocket, WebSocketDisconnect

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
    }
)
CONNECT_SECONDS = 5.0


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
        url = f"http://{target}/{params['path']}"
        headers = [(k, v) for k, v in request.headers.items() if k not in DROPPED_HEADERS]
        # a client per request: a container's server is reached once per browser request
        client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=CONNECT_SECONDS))
        outgoing = client.build_request(
            request.method,
            url,
            params=request.url.query,
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
        kept = {k: v for k, v in answer.headers.items() if k.lower() not in DROPPED_HEADERS}
        return StreamingResponse(
            answer.aiter_raw(),
            status_code=answer.status_code,
            headers=kept,
            background=BackgroundTask(_close, answer, client),
        )

    async def websocket(self, ws: WebSocket) -> None:
        params = ws.path_params
        try:
            target = await self._address(params["instance"], params["port"])
        except ApiError as exc:
            await ws.close(4404 if exc.status == 404 else 4400)
            return
        query = f"?{ws.url.query}" if ws.url.query else ""
        try:
            upstream = await websockets.connect(
                f"ws://{target}/{params['path']}{query}", open_timeout=CONNECT_SECONDS
            )
        except (OSError, websockets.WebSocketException, TimeoutError):
            await ws.close(4502)
            return
        await ws.accept()
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
