"""A small stand-in for the control plane's agent endpoints, served by uvicorn in a thread."""

import threading
import time

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from tests.agent.agents import free_port

HOST_ID = 7
HOST_SECRET = "host-secret-7"


class FakeControlPlane:
    def __init__(
        self,
        refuse: str | None = None,
        port: int | None = None,
        stream: bool = False,
        stream_breaks_after: int | None = None,
        stream_answer=None,
    ):
        """`stream`: serve /agent/v1/samples/stream too; `stream_breaks_after`: drop each
        stream's socket, unanswered, at that frame (1 = the first); `stream_answer`: answer
        every frame with this instead."""
        self.refuse = refuse  # registration answers 403 with this detail
        self.requests: list[tuple[str, dict, dict]] = []  # (path, headers, body)
        self.stream_breaks_after = stream_breaks_after
        self.stream_answer = stream_answer
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        routes = [
            Route("/agent/v1/register", self.register, methods=["POST"]),
            Route("/agent/v1/heartbeat", self.record, methods=["POST"]),
            Route("/agent/v1/samples", self.record, methods=["POST"]),
            Route("/agent/v1/events", self.record, methods=["POST"]),
        ]
        if stream:
            routes.append(WebSocketRoute("/agent/v1/samples/stream", self.stream))
        app = Starlette(routes=routes)
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the fake control plane did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)

    async def register(self, request: Request) -> JSONResponse:
        await self.record(request)
        if self.refuse:
            return JSONResponse({"error": "invalid_token", "detail": self.refuse}, status_code=403)
        answer = {
            "host_id": HOST_ID,
            "secret": HOST_SECRET,
            "heartbeat_interval": 5.0,
            "sample_interval": 1.0,
        }
        return JSONResponse(answer, status_code=201)

    async def record(self, request: Request) -> JSONResponse:
        self.requests.append((request.url.path, dict(request.headers), await request.json()))
        return JSONResponse({"ok": True})

    async def stream(self, websocket: WebSocket) -> None:
        """Frames are recorded under the path `samples/stream`, each answered 202."""
        await websocket.accept()
        frames = 0
        try:
            while True:
                body = await websocket.receive_json(mode="binary")
                frames += 1
                if frames == self.stream_breaks_after:
                    return await websocket.close(code=1011)
                self.requests.append(("/agent/v1/samples/stream", dict(websocket.headers), body))
                answer = {"status": 202, "accepted": len(body["samples"])}
                await websocket.send_json(self.stream_answer or answer)
        except WebSocketDisconnect:
            return

    def received(self, path: str) -> list[tuple[dict, dict]]:
        """(headers, body) of each request to `path`, in order."""
        return [(h, b) for p, h, b in list(self.requests) if p == f"/agent/v1/{path}"]
