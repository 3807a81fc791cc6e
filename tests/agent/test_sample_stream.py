"""The agent sends its sample rounds over the console's websocket when the console has one, and
posts them when it has none or the socket breaks: no round is lost either way."""

import asyncio

import pytest

from agent.backends.sim import SimBackend
from agent.control import Reporter
from agent.gpu_models import MODELS
from agent.host import LocalHost
from agent.runtimes.sim import SimRuntime
from agent.sample_stream import stream_url
from agent.state import StateStore
from tests.agent.fake_control_plane import HOST_ID, HOST_SECRET, FakeControlPlane


def _host(tmp_path) -> LocalHost:
    return LocalHost(
        "h", SimBackend("h", MODELS["l4"], ["whole"]), SimRuntime(), StateStore(tmp_path)
    )


def _push_rounds(host, server, rounds: int) -> list[float]:
    """Push `rounds` rounds one by one, as the agent does each second; the rounds' stamps."""
    identity = {"server": server.url, "host_id": HOST_ID, "secret": HOST_SECRET}

    async def scenario():
        reporter = Reporter(host, identity, 5.0, "http://127.0.0.1:9101")
        stamps = []
        for _ in range(rounds):
            samples = host.poll()
            stamps.append(samples[0]["ts"])
            reporter.add(samples)
            await reporter.push()
            assert not reporter.backing_off
        await reporter.aclose()
        return stamps

    return asyncio.run(scenario())


def _stamps(server, path) -> list[float]:
    return [body["samples"][0]["ts"] for _, body in server.received(path)]


def test_rounds_go_over_the_stream_with_the_hosts_secret(tmp_path):
    with FakeControlPlane(stream=True) as server:
        stamps = _push_rounds(_host(tmp_path), server, 3)
    assert _stamps(server, "samples/stream") == stamps
    assert server.received("samples") == []
    headers = [h for h, _ in server.received("samples/stream")]
    assert {h["authorization"] for h in headers} == {f"Bearer {HOST_SECRET}"}


def test_a_console_without_the_stream_gets_posts(tmp_path):
    with FakeControlPlane() as server:
        stamps = _push_rounds(_host(tmp_path), server, 3)
    assert _stamps(server, "samples") == stamps


def test_a_round_whose_stream_breaks_is_posted_and_the_next_streams_again(tmp_path):
    with FakeControlPlane(stream=True, stream_breaks_after=2) as server:
        stamps = _push_rounds(_host(tmp_path), server, 4)
    # each socket breaks, unanswered, at its second frame: that round is posted, and the next
    # one goes over a new socket
    assert _stamps(server, "samples") == [stamps[1], stamps[3]]
    assert _stamps(server, "samples/stream") == [stamps[0], stamps[2]]


@pytest.mark.parametrize("junk", [[202], {"accepted": 1}, {"status": "202"}, "ok"])
def test_a_round_answered_with_junk_is_posted(tmp_path, junk):
    with FakeControlPlane(stream=True, stream_answer=junk) as server:
        stamps = _push_rounds(_host(tmp_path), server, 2)
    assert _stamps(server, "samples") == stamps


def test_the_stream_is_a_websocket_on_the_consoles_own_address():
    assert stream_url("http://10.0.0.5:8000") == "ws://10.0.0.5:8000/agent/v1/samples/stream"
    assert stream_url("https://console.example") == (
        "wss://console.example/agent/v1/samples/stream"
    )
