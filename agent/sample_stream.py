"""The agent's websocket for sample batches: `{server}/agent/v1/samples/stream`.

A batch posted costs the agent ~1.5 ms of CPU in httpx and the console a whole request; over a
websocket it is one frame each way, ~0.3 ms (console/metrics/asgi.py). Each frame is a POST
body; the console answers each with `{"status": ..., **the POST's answer}`, in order. The
socket is opened with the host's secret in the Authorization header, to the server the agent's
requests go to now, and opened again with the new one when the console rotates it.

When the console cannot take a stream (an older console, a proxy without websockets, a refused
secret: the handshake fails), `send` answers None and the caller posts the batch; a stream is
tried again after RETRY_SECONDS. A socket that breaks with a batch in flight also answers None:
the batch is posted, and the console keeps a sample pushed twice once."""

import asyncio
import json
import logging
import time
from collections.abc import Callable

import websockets

log = logging.getLogger(__name__)

STREAM_PATH = "/agent/v1/samples/stream"
RETRY_SECONDS = 60.0
ANSWER_MAX_BYTES = 64 * 1024
CLOSE_SECONDS = 2.0


def stream_url(server: str) -> str:
    """The stream's ws(s) URL on a console's http(s) base URL."""
    scheme, _, rest = server.partition("://")
    return f"{'wss' if scheme == 'https' else 'ws'}://{rest}{STREAM_PATH}"


class SampleStream:
    def __init__(self, secret: Callable[[], str], timeout: float):
        """`secret`: the host secret as it is now (agent/identity.py)."""
        self._secret = secret
        self._opened_with = ""
        self._timeout = timeout
        self._socket = None
        self._server: str | None = None
        self._retry_at = 0.0

    async def send(self, server: str, body: bytes) -> tuple[int, dict] | None:
        """The console's (HTTP status, answer) to `body` sent to `server`'s stream, or None when
        no stream carried it: the caller posts it instead."""
        if self._server != server or self._opened_with != self._secret():
            await self.close()
        if self._socket is None and not await self._open(server):
            return None
        try:
            # asyncio.timeout, not wait_for: in Python 3.11 wait_for can swallow a cancellation
            # that comes as the answer does, and the agent's loop would not stop
            async with asyncio.timeout(self._timeout):
                await self._socket.send(body)
                raw = await self._socket.recv()
            answer = json.loads(raw)
            status = answer.pop("status")
            if type(status) is not int:
                raise ValueError(f"an answer's status is {status!r}")
        except (websockets.ConnectionClosed, TimeoutError, ValueError, KeyError, TypeError,
                AttributeError) as exc:  # fmt: skip
            log.warning("sample stream to %s broke (%s): posting", server, exc)
            await self.close()
            return None
        return status, answer

    async def _open(self, server: str) -> bool:
        if time.monotonic() < self._retry_at:
            return False
        secret = self._secret()
        try:
            self._socket = await websockets.connect(
                stream_url(server),
                additional_headers={"Authorization": f"Bearer {secret}"},
                open_timeout=self._timeout,
                close_timeout=CLOSE_SECONDS,  # an agent stopping waits no longer for the console
                compression=None,
                max_size=ANSWER_MAX_BYTES,
            )
        except (OSError, TimeoutError, websockets.WebSocketException) as exc:
            self._retry_at = time.monotonic() + RETRY_SECONDS
            log.info("no sample stream at %s (%s): posting", server, exc)
            return False
        self._server, self._opened_with = server, secret
        return True

    async def close(self) -> None:
        socket, self._socket, self._server = self._socket, None, None
        if socket is not None:
            await socket.close()
