"""A browser terminal tab that closes is routine: whether the console closes its websocket
with a close frame or its connection just drops while the shell is printing, the agent ends
(or keeps) the shell and logs no error and no traceback for it."""

import asyncio
import secrets
import time

import pytest
import websockets

from tests.agent.test_access import grant
from tests.agent.test_oci_runtime import launch_body

pytestmark = pytest.mark.containers
# A shell that prints without pause: the agent is sending when the client goes.
FLOOD = b"while :; do echo flooding the terminal; done\r"


@pytest.fixture
def running(start_agent, container_engine):
    """An agent with the oci runtime and one running instance; (agent, instance)."""
    agent = start_agent("--gpus", "1", "--runtime", "oci", "--engine-url", container_engine.url)
    instance = f"t{secrets.token_hex(4)}"
    body = launch_body(instance, None)
    assert agent.client.put(f"/v1/allocations/{instance}-a", json=body).json()["state"] == "running"
    return agent, instance


async def flood_then(url: str, headers: dict, close) -> None:
    async with websockets.connect(url, additional_headers=headers) as ws:
        await ws.send(FLOOD)
        seen = b""
        while seen.count(b"flooding the terminal") < 50:
            seen += await asyncio.wait_for(ws.recv(), 10)
        await close(ws)


async def close_frame(ws) -> None:
    await ws.close(1000)


async def drop_connection(ws) -> None:
    """The TCP connection goes without a close frame (a browser or console killed)."""
    ws.transport.abort()


async def drop_at_once(url: str, headers: dict) -> None:
    """The tab goes as soon as the terminal connected: with a session key, a kept shell is
    taken back (its backlog sent) after the client went."""
    async with websockets.connect(url, additional_headers=headers) as ws:
        ws.transport.abort()


def problems(log: str) -> list[str]:
    return [line for line in log.splitlines() if "Traceback" in line or " ERROR " in line]


@pytest.mark.parametrize("session", [False, True], ids=["plain", "with-session-key"])
def test_a_closed_terminal_is_not_an_error(running, session):
    agent, instance = running
    query = f"cols=80&rows=24&session={secrets.token_urlsafe(16)}" if session else "cols=80&rows=24"
    url = f"ws://127.0.0.1:{agent.port}/v1/instances/{instance}/terminal?{query}"
    auth = grant("terminal", instance)
    for close in (close_frame, drop_connection):
        asyncio.run(flood_then(url, auth, close))
    asyncio.run(drop_at_once(url, auth))
    time.sleep(3)  # the shells are ended (or kept) after the websocket went
    log = agent.log()
    print(log[-6000:])
    assert problems(log) == [], log[-4000:]
