"""A websocket test client for an ASGI application, in process.

channels.testing.WebsocketCommunicator would do, but importing channels.testing needs daphne
(for its live server), which gpucloud does not install."""

import contextlib

from asgiref.testing import ApplicationCommunicator


class WebsocketCommunicator(ApplicationCommunicator):
    def __init__(self, application, path: str, headers=None):
        scope = {
            "type": "websocket",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "headers": headers or [],
            "subprotocols": [],
            "client": ("127.0.0.1", 50000),
            "server": ("testserver", 80),
        }
        super().__init__(application, scope)

    async def connect(self, timeout: float = 1) -> tuple[bool, object]:
        """(True, subprotocol) when accepted; (False, close code) when refused."""
        await self.send_input({"type": "websocket.connect"})
        response = await self.receive_output(timeout)
        if response["type"] == "websocket.close":
            return False, response.get("code", 1000)
        assert response["type"] == "websocket.accept", response
        return True, response.get("subprotocol")

    async def receive_from(self, timeout: float = 1) -> str:
        response = await self.receive_output(timeout)
        assert response["type"] == "websocket.send", response
        return response["text"]

    async def disconnect(self, code: int = 1000, timeout: float = 1) -> None:
        await self.send_input({"type": "websocket.disconnect", "code": code})
        with contextlib.suppress(TimeoutError):
            await self.wait(timeout)


def run(scenario):
    """Run an async test scenario to the end, in a thread of its own: the thread that runs the
    tests may hold Playwright's event loop (after a browser test), where async_to_sync refuses to
    run. Database work of the scenario happens in that thread: committed data only."""
    from concurrent.futures import ThreadPoolExecutor

    from asgiref.sync import async_to_sync
    from django.db import connections

    def body():
        try:
            return async_to_sync(scenario)()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(body).result()
