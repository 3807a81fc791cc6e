"""Browser terminals that outlive a console restart.

A terminal opened with a session key is the console's to end: when the console closes it with
1000 (its browser closed the panel or the tab) the shell ends at once, as it does when the
shell exits. When the console goes without saying so (its web process restarts or dies, the
network drops) the shell is kept, its output drained into a bounded backlog so that nothing in
the container blocks on a full terminal, for REATTACH_GRACE_SECONDS; a terminal opened again
with the same key for the same instance in that time gets the same shell and the backlog.
After the grace the shell ends as any closed shell does (agent/shell.py).

Each terminal belongs to the member the console opened it for (`member`, the console's id of the
membership). The console's push of an instance's access (`PUT /v1/instances/{id}/ssh-keys` with
`members`, the members who may still hold a shell) ends at once every terminal of a member it no
longer names, open or kept: its shell and everything it started (agent/sessions.py), its
socket closed with 4403."""

import asyncio
import contextlib
import re

from agent.errors import invalid
from agent.shell import Shell

REATTACH_GRACE_SECONDS = 60.0
BACKLOG_BYTES = 64 * 1024
SESSION_KEY = re.compile(r"[A-Za-z0-9_-]{16,128}")
MEMBER = re.compile(r"[A-Za-z0-9_-]{1,64}")
WITHDRAWN = 4403  # the close code of a terminal whose member's access went


def parse_members(body: dict) -> set[str] | None:
    """`members` of the access push: the members who may hold a terminal now (None: the console
    did not say, and no terminal is ended for its member)."""
    members = body.get("members")
    if members is None:
        return None
    if not isinstance(members, list) or not all(
        isinstance(m, str) and MEMBER.fullmatch(m) for m in members
    ):
        raise invalid("members must be a list of member ids ([A-Za-z0-9_-], 1 to 64 characters)")
    return set(members)


class Kept:
    """A shell whose console went: its output goes to a backlog until it is taken back or its
    grace ends."""

    def __init__(self, shell: Shell, member: str | None, on_end):
        self.shell = shell
        self.member = member
        self.backlog = bytearray()
        self.ended = False
        self.drain = asyncio.ensure_future(self._drain())
        self.timer = asyncio.get_running_loop().call_later(REATTACH_GRACE_SECONDS, on_end)

    async def _drain(self) -> None:
        while (chunk := await self.shell.read()) is not None:
            self.backlog += chunk[1]
            del self.backlog[:-BACKLOG_BYTES]
        self.ended = True

    async def release(self) -> bytes:
        """Stop draining: the shell goes back to a client; what it printed meanwhile."""
        self.timer.cancel()
        self.drain.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.drain
        return bytes(self.backlog)

    def end(self) -> None:
        self.timer.cancel()
        self.drain.cancel()
        self.shell.close()


class Terminals:
    """The terminals of one agent: those open, with their instance and member, and the kept
    shells by (instance, session key). `ended(instance, message)` hears of a kept shell that
    ended without being taken back (the console's event)."""

    def __init__(self, ended=lambda instance, message: None):
        self.open: dict[Shell, tuple[str, str | None]] = {}
        self.kept: dict[tuple[str, str], Kept] = {}
        self.ended = ended

    def keep(self, instance: str, key: str, shell: Shell, member: str | None) -> None:
        place = (instance, key)
        self.drop(place)
        self.kept[place] = Kept(shell, member, lambda: self._expire(place))

    def withdraw(self, instance: str, keys: list[dict], members: set[str] | None) -> None:
        """The instance's access was pushed: end each terminal of a member no longer named."""
        if members is None:
            return
        for shell, (held, member) in list(self.open.items()):
            if held == instance and member is not None and member not in members:
                shell.withdrawn = True
                shell.close()  # its relay sees the output end, and closes with WITHDRAWN
        for place, kept in list(self.kept.items()):
            if place[0] == instance and kept.member is not None and kept.member not in members:
                self.drop(place)
                self.ended(instance, "terminal session ended: its member's access was withdrawn")

    def _expire(self, place: tuple[str, str]) -> None:
        if place in self.kept:
            self.drop(place)
            self.ended(place[0], "terminal session ended: not taken back in time")

    async def take(self, instance: str, key: str) -> tuple[Shell, bytes] | None:
        """The kept shell of this instance and key with its backlog, or None (none kept, or it
        ended meanwhile)."""
        kept = self.kept.pop((instance, key), None)
        if kept is None:
            return None
        backlog = await kept.release()
        if kept.ended:
            kept.shell.close()
            return None
        return kept.shell, backlog

    def drop(self, place: tuple[str, str]) -> None:
        kept = self.kept.pop(place, None)
        if kept is not None:
            kept.end()
