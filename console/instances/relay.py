"""Websockets the console relays to a host agent: the browser terminal
(/ws/instances/{id}/terminal/) and the websockets of an instance's web ports (any path on
the port's own origin, e.g. Jupyter's kernels; console.instances.ports routes them).

Frames go through as they are, both ways; when one side closes, the other is closed too.
Only members with role member or above of the instance's tenant get through (access.target);
an open socket is closed (4403) once the membership, the role or the API token goes: at once
for a terminal whose member is removed or lowered (the agent ends it when the instance's keys
are pushed, agent/terminals.py), else at the next look (RECHECK_SECONDS)."""

import asyncio
import contextlib
import hashlib
import json
import logging
import re
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from accounts.websocket import RECHECK_SECONDS
from console import activity, integers
from console.fleet import agent_client
from console.instances import access, port_origin

log = logging.getLogger(__name__)

_target = database_sync_to_async(access.target)
_shell_stands = database_sync_to_async(access.shell_stands)
_record_session = database_sync_to_async(access.record_session)
_opened = database_sync_to_async(activity.opened)
_ended = database_sync_to_async(activity.ended)

AGENT_UNAVAILABLE = 4502
MAX_SIZE = 1000  # columns or rows
KEEP_SHELL = 4001  # the agent keeps the shell for its reattach grace (agent/terminals.py)
REATTACH_SECONDS = 60  # that grace, as the agent keeps it
TERMINAL_SESSION = re.compile(r"[A-Za-z0-9_-]{16,64}")


class AgentRelay(AsyncWebsocketConsumer):
    """Accepts the browser's socket, opens the agent's, and pumps frames between them."""

    agent = None
    pump: asyncio.Task | None = None
    watch: asyncio.Task | None = None
    port: int | None = None

    def open_agent(self, target: access.Target):
        raise NotImplementedError

    async def opened(self) -> None:
        """The relay runs (a hook for its session event)."""

    async def ended(self) -> None:
        """The relay ended (a hook for its session event)."""

    async def connect(self):
        self.instance_pk = int(self.scope["url_route"]["kwargs"]["pk"])
        membership = self.scope.get("membership")
        try:
            target = await _target(membership, self.instance_pk, self.port)
        except access.ConnectRefused as refused:
            await self.accept()
            await self.close(code=refused.close_code, reason=refused.detail[:120])
            return
        try:
            self.agent = await self.open_agent(target)
        except InvalidStatus as exc:
            await self._refuse_after_agent(exc.response.status_code)
            return
        except (OSError, InvalidHandshake, TimeoutError) as exc:
            log.info("instance %s: agent websocket refused: %s", self.instance_pk, exc)
            await self.accept()
            await self.close(code=AGENT_UNAVAILABLE, reason="Its host is not answering.")
            return
        self.membership_id = membership.pk
        self.token_id = self.scope.get("api_token_id")
        if not await _shell_stands(self.membership_id, self.token_id):
            # withdrawn while the agent's socket opened: the push may have reached it first
            agent, self.agent = self.agent, None
            await agent.close()
            await self.accept()
            await self.close(code=4403, reason="Your access was withdrawn.")
            return
        await self.accept(subprotocol=self.agent.subprotocol)
        self.pump = asyncio.create_task(self._from_agent())
        self.watch = asyncio.create_task(self._watch_access())
        await self.opened()

    async def _refuse_after_agent(self, status: int) -> None:
        await self.accept()
        if status == 404:
            await self.close(code=4404, reason="Not running on its host.")
        else:
            await self.close(code=AGENT_UNAVAILABLE, reason=f"Its host answered {status}.")

    async def _from_agent(self):
        try:
            async for message in self.agent:
                if isinstance(message, bytes):
                    await self.send(bytes_data=message)
                else:
                    await self.send(text_data=message)
        except ConnectionClosed:
            pass
        code = self.agent.close_code or 1000
        reason = self.agent.close_reason or ""
        if code != 1000 and not 4000 <= code < 5000:
            code = 1011
        await self.close(code=code, reason=reason[:120] or None)

    async def _watch_access(self):
        while True:
            await asyncio.sleep(RECHECK_SECONDS)
            if not await _shell_stands(self.membership_id, self.token_id):
                await self.close(code=4403, reason="Your access was withdrawn.")
                if self.agent is not None:
                    await self.agent.close()
                return

    async def receive(self, text_data=None, bytes_data=None):
        if self.agent is None:
            return
        try:
            if bytes_data is not None:
                await self.agent.send(bytes_data)
            elif text_data is not None:
                await self.relay_text(text_data)
        except ConnectionClosed:
            pass  # _from_agent closes the browser's socket

    async def relay_text(self, text: str) -> None:
        await self.agent.send(text)

    async def disconnect(self, code):
        for task in (self.watch, self.pump):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        if self.agent is not None:
            with contextlib.suppress(Exception):
                await self.agent.close(self.agent_close_code(code))
            await self.ended()

    def agent_close_code(self, code: int) -> int:
        """How the agent's socket is closed once the browser's closed with `code`."""
        return 1000


def terminal_key(membership_pk: int, instance_pk: int, session: str) -> str | None:
    """The agent's key for the browser's terminal session (a random id the panel keeps per
    tab), bound to the member and the instance: no one else's session id takes that shell."""
    if not TERMINAL_SESSION.fullmatch(session):
        return None
    return hashlib.sha256(f"{membership_pk}:{instance_pk}:{session}".encode()).hexdigest()


def _size(query: dict, name: str, default: int) -> int:
    """The query's `name` (cols or rows), `default` when it is not given; NotAWholeNumber
    when it is not a size."""
    given = query.get(name)
    return integers.parse(given[0], minimum=1, maximum=MAX_SIZE) if given else default


class TerminalConsumer(AgentRelay):
    """/ws/instances/{id}/terminal/?cols=80&rows=24: a shell in the instance's container.
    Binary frames carry the terminal's bytes; a text frame {"type": "resize", "cols": N,
    "rows": M} resizes (anything else in text is ignored). Each session is an event."""

    key: str | None = None
    kept = False
    size = (80, 24)

    async def connect(self):
        """A size that is no number of columns or rows is refused (4400) before anything."""
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        try:
            self.size = (_size(query, "cols", 80), _size(query, "rows", 24))
        except integers.NotAWholeNumber as error:
            await self.accept()
            await self.close(code=4400, reason=f"cols and rows: {error}")
            return
        await super().connect()

    def open_agent(self, target):
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        cols, rows = self.size
        session = (query.get("session") or [""])[0]
        self.key = terminal_key(self.scope["membership"].pk, target.instance_pk, session)
        return agent_client.connect_terminal(
            target.host, target.instance_pk, self.scope["membership"].pk, cols, rows, self.key
        )

    def agent_close_code(self, code: int) -> int:
        """A browser that closed the panel or left the page (1000, 1001) ends its shell; a
        socket that dropped, or a console that restarts (1012), leaves it to be taken back."""
        self.kept = code not in (1000, 1001) and self.key is not None
        return KEEP_SHELL if self.kept else 1000

    async def relay_text(self, text: str) -> None:
        try:
            frame = json.loads(text)
        except ValueError:
            return
        if not isinstance(frame, dict) or frame.get("type") != "resize":
            return
        cols, rows = frame.get("cols"), frame.get("rows")
        if all(type(n) is int and 1 <= n <= MAX_SIZE for n in (cols, rows)):
            await self.agent.send(json.dumps({"type": "resize", "cols": cols, "rows": rows}))

    def _who(self) -> str:
        return getattr(self.scope.get("user"), "username", None) or "someone"

    async def opened(self):
        await _opened(self.instance_pk, "terminal")
        resumed = self.agent.response.headers.get("x-terminal") == "resumed"
        what = "taken back" if resumed else "opened"
        await _record_session(
            self.instance_pk,
            f"terminal session {what} by {self._who()}",
            actor=self.scope.get("user"),
        )

    async def ended(self):
        await _ended(self.instance_pk, "terminal")
        if self.kept:
            what = f"left: its shell waits {REATTACH_SECONDS} s to be taken back"
        else:
            what = "ended"
        await _record_session(
            self.instance_pk,
            f"terminal session of {self._who()} {what}",
            actor=self.scope.get("user"),
        )


class PortSocketConsumer(AgentRelay):
    """A websocket on an instance's port origin (Jupyter's kernels), relayed to the container
    through its agent with its raw path and query; the subprotocols the browser offers, its
    Origin, the app's cookies and the origin's host (port_origin.app_headers) go on.
    ports.by_host routes it (url_route: pk, port) and says who opened it (membership)."""

    async def connect(self):
        self.port = int(self.scope["url_route"]["kwargs"]["port"])
        try:
            await super().connect()
        except agent_client.PortPathRefused as refused:
            await self.accept()
            await self.close(code=4400, reason=str(refused)[:120])

    async def open_agent(self, target):
        return await agent_client.connect_port_websocket(
            target.host,
            target.instance_pk,
            self.port,
            self.scope["raw_path"].decode("latin-1")[1:],
            self.scope.get("query_string", b"").decode("latin-1"),
            list(self.scope.get("subprotocols") or []),
            self._forwarded(),
        )

    async def opened(self):
        await _opened(self.instance_pk, "ports")

    async def ended(self):
        await _ended(self.instance_pk, "ports")

    def _forwarded(self) -> list[tuple[str, str]]:
        origin = [
            ("origin", v.decode("latin-1")) for k, v in self.scope["headers"] if k == b"origin"
        ]
        return origin + port_origin.app_headers(self.scope)
