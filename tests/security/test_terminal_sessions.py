"""A browser terminal's session id (kept by the panel, sent in the query) takes back a shell the
agent kept after its console went: only for the member and the instance it was made for. The
agent's key is derived from all three; an id of the wrong shape names no shell. The real path
(a web process restarted under an open terminal; another member sending the same id gets a
shell of their own) is tests/instances/test_e2e_access.py's.

A terminal's processes end with it, however they detach, and a terminal ends at once, open or
kept, when the console's push of the instance's access no longer names its member (issues: a
process started with setsid outlived its terminal; a removed member's terminal ran ~22 s more,
until the console's next look). The member removed through the console is
test_access_ends.py's."""

import asyncio
import secrets
import time

import pytest
import websockets

from agent.shell import HANGUP_GRACE_SECONDS
from agent.terminals import SESSION_KEY
from console.instances.relay import terminal_key
from tests.agent.test_access import grant
from tests.security.gateway import until

SESSION = "0123456789abcdef0123456789abcdef"


def test_the_agents_key_is_bound_to_the_member_and_the_instance():
    mine = terminal_key(7, 42, SESSION)
    assert SESSION_KEY.fullmatch(mine)
    assert mine != terminal_key(8, 42, SESSION)  # another member of the tenant
    assert mine != terminal_key(7, 43, SESSION)  # another instance
    assert mine == terminal_key(7, 42, SESSION)


@pytest.mark.parametrize(
    "session",
    ["", "short", "../../etc", SESSION + "&cols=1", "x" * 65, "é" * 20, "a b" * 8, "%2e" * 8],
)
def test_a_session_id_of_any_other_shape_keeps_nothing(session):
    assert terminal_key(7, 42, session) is None


async def _detach(ws, marker: str) -> None:
    """Start `marker` (a sleep) in its own session, and wait for the shell to say so."""
    await ws.send(f"busybox setsid {marker} </dev/null >/dev/null 2>&1 & echo STA''RTED\r".encode())
    seen = b""
    while b"STARTED\r\n" not in seen:
        seen += await asyncio.wait_for(ws.recv(), 10)


@pytest.mark.integration
@pytest.mark.containers
def test_a_terminal_ends_with_what_it_started_and_at_once_when_its_member_goes(gateway):
    instance = gateway.instance
    base = f"ws://127.0.0.1:{gateway.agent.port}/v1/instances/{instance}/terminal?cols=80&rows=24"
    auth = grant("terminal", instance)
    closed, removed, kept, stays = (f"sleep 2{secrets.randbelow(10**6):06d}" for _ in range(4))

    def connect(member: str, session: str = ""):
        query = f"&member={member}" + (f"&session={session}" if session else "")
        return websockets.connect(base + query, additional_headers=auth)

    async def scenario() -> float:
        async with connect("7") as ws:  # closed on purpose: its shell ends, and what it left
            await _detach(ws, closed)
        mine = await connect("7", secrets.token_urlsafe(16))
        await _detach(mine, removed)
        async with connect("7", secrets.token_urlsafe(16)) as dropped:  # kept for 60 s
            await _detach(dropped, kept)
            dropped.transport.abort()
        theirs = await connect("8")
        await _detach(theirs, stays)
        await asyncio.to_thread(until, lambda: not gateway.runs(closed), 5, "the closed one's")
        started = time.monotonic()
        await asyncio.to_thread(gateway.set_keys, "laptop", members=["8"])
        with pytest.raises(websockets.ConnectionClosed) as ended:
            while True:
                await asyncio.wait_for(mine.recv(), 5)
        took = time.monotonic() - started
        assert ended.value.rcvd.code == 4403
        assert await asyncio.to_thread(gateway.runs, stays)
        await theirs.send(b"echo $((6*7))\r")
        seen = b""
        while b"42\r\n" not in seen:
            seen += await asyncio.wait_for(theirs.recv(), 10)
        await theirs.close()
        return took

    assert asyncio.run(scenario()) < 2
    for marker in (removed, kept):
        until(lambda m=marker: not gateway.runs(m), HANGUP_GRACE_SECONDS + 3, "member 7's sleeps")
    until(lambda: not gateway.runs(stays), HANGUP_GRACE_SECONDS + 3, "member 8's, closed since")
