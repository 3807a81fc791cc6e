"""Registration, heartbeats and sample pushes, against a fake control plane."""

import asyncio
import json
import time

import pytest

from agent import AGENT_VERSION
from agent.backends.sim import SimBackend
from agent.control import BUFFER_ROUNDS, ROUNDS_PER_POST, Reporter
from agent.gpu_models import MODELS
from agent.host import LocalHost
from agent.runtimes.sim import SimRuntime
from agent.service import lifespan
from agent.state import StateStore
from tests.agent.agents import free_port, wait_for
from tests.agent.fake_control_plane import HOST_ID, HOST_SECRET, FakeControlPlane

REGISTER_KEYS = {"join_token", "hostname", "address", "region", "agent_version", "inventory"}
HEARTBEAT_KEYS = {
    "host_id",
    "agent_version",
    "address",
    "inventory_digest",
    "inventory",
    "allocations",
}
SAMPLE_KEYS = {
    "ts",
    "kind",
    "gpu_index",
    "gpu_uuid",
    "mig_uuid",
    "allocation",
    "gpu_util",
    "mem_used_mib",
    "mem_total_mib",
    "temperature_c",
    "power_w",
    "sm_clock_mhz",
    "ecc_errors",
    "healthy",
    "processes",
}
SHARED = {
    "mode": "shared",
    "gpus": [0],
    "shared": {"milli": 500, "memory_mib": 8192},
    "sim": {"util": 80, "mem_mib": 4096},
}
MIG = {"mode": "mig", "gpus": [1], "mig": {"profile": "1g.10gb", "start": 0}}


def _samples(server) -> list[dict]:
    return [s for _, body in server.received("samples") for s in body["samples"]]


@pytest.mark.integration
def test_register_heartbeat_samples_and_restart(start_agent):
    args = ("--gpus", "2", "--mode", "shared,mig", "--region", "eu-west")
    with FakeControlPlane() as server:
        agent = start_agent("--server", server.url, "--join-token", "join-1", *args, secret=None)
        assert agent.client.get("/v1/allocations").status_code == 401
        api = agent.client_with(HOST_SECRET)
        assert api.put("/v1/allocations/s-1", json=SHARED).status_code == 201
        mig_uuid = api.put("/v1/allocations/m-1", json=MIG).json()["mig"]["uuid"]
        wait_for(lambda: any(body["allocations"] for _, body in server.received("heartbeat")))
        wait_for(lambda: {s["allocation"] for s in _samples(server)} >= {"s-1", "m-1"})
        wait_for(lambda: len(server.received("samples")) >= 2)

        [(_, registration)] = server.received("register")
        assert set(registration) == REGISTER_KEYS
        assert registration["join_token"] == "join-1"
        assert registration["hostname"] == "test-host"
        assert registration["address"] == agent.url
        assert registration["region"] == "eu-west"
        assert registration["agent_version"] == AGENT_VERSION
        assert [g["mode"] for g in registration["inventory"]["gpus"]] == ["shared", "mig"]
        identity = json.loads((agent.state_dir / "identity.json").read_text())
        assert identity["host_id"] == HOST_ID and identity["secret"] == HOST_SECRET
        assert identity["server"] == server.url

        for headers, body in server.received("heartbeat"):
            assert headers["authorization"] == f"Bearer {HOST_SECRET}"
            assert set(body) == HEARTBEAT_KEYS
            assert body["host_id"] == HOST_ID
            assert body["address"] == agent.url
            assert body["inventory_digest"] == body["inventory"]["digest"]
        latest = server.received("heartbeat")[-1][1]
        assert {a["id"] for a in latest["allocations"]} == {"s-1", "m-1"}

        for headers, body in server.received("samples"):
            assert headers["authorization"] == f"Bearer {HOST_SECRET}"
            assert set(body) == {"host_id", "samples"} and body["host_id"] == HOST_ID
        samples = _samples(server)
        assert all(set(s) == SAMPLE_KEYS for s in samples)
        for index in (0, 1):
            stamps = [s["ts"] for s in samples if s["kind"] == "gpu" and s["gpu_index"] == index]
            assert len(stamps) >= 3
            assert all(a < b for a, b in zip(stamps, stamps[1:], strict=False))

        shared = [s for s in samples if s["allocation"] == "s-1"][-1]
        assert shared["kind"] == "allocation"
        assert (shared["mem_used_mib"], shared["mem_total_mib"]) == (4096, 8192)
        assert 75 <= shared["gpu_util"] <= 85  # of its half of the GPU
        gpu0 = [s for s in samples if s["kind"] == "gpu" and s["gpu_index"] == 0][-1]
        assert 35 <= gpu0["gpu_util"] <= 45 and gpu0["mem_used_mib"] == 4096
        mig = [s for s in samples if s["kind"] == "mig"][-1]
        assert mig["mig_uuid"] == mig_uuid and mig["mem_total_mib"] == 9728
        mig_alloc = [s for s in samples if s["allocation"] == "m-1"][-1]
        assert mig_alloc["kind"] == "allocation" and mig_alloc["mig_uuid"] == mig_uuid

        # a restarted agent keeps its identity: it does not register again
        beats = len(server.received("heartbeat"))
        assert agent.terminate() in (0, -15)  # uvicorn re-raises SIGTERM once shut down
        assert "agent stopped" in agent.log()
        again = start_agent("--server", server.url, *args, state_dir=agent.state_dir, secret=None)
        wait_for(lambda: len(server.received("heartbeat")) > beats)
        assert len(server.received("register")) == 1
        # on another port now: its heartbeats say so
        assert server.received("heartbeat")[-1][1]["address"] == again.url != agent.url
        listed = again.client_with(HOST_SECRET).get("/v1/allocations").json()["allocations"]
        assert {a["id"] for a in listed} == {"s-1", "m-1"}


@pytest.mark.integration
def test_agent_rides_out_a_control_plane_outage(start_agent):
    with FakeControlPlane() as server:
        agent = start_agent(
            "--server", server.url, "--gpus", "1", "--join-token", "join-2", secret=None
        )
        wait_for(lambda: server.received("samples"))
    outage = time.time()
    time.sleep(1.5)
    assert agent.client_with(HOST_SECRET).get("/v1/inventory").status_code == 200
    assert "heartbeat to" in agent.log()  # logged, not fatal
    with FakeControlPlane(port=server.port) as back:
        wait_for(lambda: back.received("heartbeat"))
        # what was read while the server was away arrives once it is back
        wait_for(lambda: any(outage < s["ts"] < outage + 1 for s in _samples(back)))
    assert agent.proc.poll() is None
    assert len(back.received("register")) == 0


@pytest.mark.integration
def test_an_agent_given_two_servers_moves_to_the_one_that_answers_and_stays(start_agent):
    """Two web processes of one console: the agent registers with the first it reaches,
    reports to it while it answers, moves to the other when it goes away (samples read
    meanwhile included), and stays there when the first comes back."""
    with FakeControlPlane() as second:
        with FakeControlPlane() as away:
            gone = away.port  # nobody listens there: registration moves on at once
        agent = start_agent(
            "--server", f"http://127.0.0.1:{gone}", "--server", second.url, "--gpus", "1",
            "--join-token", "join-3", "--heartbeat-interval", "0.2", secret=None,
        )  # fmt: skip
        wait_for(lambda: second.received("samples") and second.received("heartbeat"))
        assert len(second.received("register")) == 1
        identity = json.loads((agent.state_dir / "identity.json").read_text())
        assert identity["server"] == second.url
        with FakeControlPlane(port=gone) as first:
            time.sleep(1)
            assert not first.requests  # sticky: the one in use answers
        outage = time.time()
    with FakeControlPlane(port=gone) as first:
        wait_for(lambda: first.received("heartbeat"))
        wait_for(lambda: any(outage < s["ts"] < outage + 0.5 for s in _samples(first)))
        assert not first.received("register")
        assert "trying http://127.0.0.1:" in agent.log()
        assert agent.proc.poll() is None


@pytest.mark.integration
def test_servers_may_be_given_comma_separated_and_a_restart_needs_the_one_it_joined(
    start_agent,
):
    with FakeControlPlane() as first, FakeControlPlane() as second:
        both = f"{first.url},{second.url}"
        agent = start_agent("--server", both, "--gpus", "1", "--join-token", "j-4", secret=None)
        wait_for(lambda: first.received("heartbeat"))
        agent.terminate()
        # registered with the first: without it, the agent cannot tell it is the same console
        alone = start_agent(
            "--server", second.url, "--gpus", "1", state_dir=agent.state_dir, secret=None,
            wait=False,
        )  # fmt: skip
        assert alone.proc.wait(20) != 0
        assert "give that --server too" in alone.log()
        again = f"{second.url},{first.url}"
        start_agent("--server", again, "--gpus", "1", state_dir=agent.state_dir, secret=None)
        wait_for(lambda: second.received("heartbeat"))  # the first listed, while it answers
        assert [len(s.received("register")) for s in (first, second)] == [1, 0]


@pytest.mark.integration
def test_refused_registration_exits_with_the_message(start_agent):
    with FakeControlPlane(refuse="join token already used") as server:
        agent = start_agent(
            "--server", server.url, "--gpus", "1", "--join-token", "used", secret=None, wait=False
        )
        assert agent.proc.wait(20) != 0
    log = agent.log()
    assert "join token already used" in log
    assert "403" in log
    assert not (agent.state_dir / "identity.json").exists()


def test_samples_wait_in_a_bounded_buffer_while_the_server_is_away(tmp_path):
    host = LocalHost(
        "h", SimBackend("h", MODELS["l4"], ["whole"]), SimRuntime(), StateStore(tmp_path)
    )
    port = free_port()
    identity = {"server": f"http://127.0.0.1:{port}", "host_id": HOST_ID, "secret": HOST_SECRET}

    async def scenario():
        reporter = Reporter(host, identity, 5.0, "http://127.0.0.1:9101")
        rounds = [host.poll() for _ in range(BUFFER_ROUNDS + 20)]
        for samples in rounds:
            reporter.add(samples)
        await reporter.heartbeat()  # nobody listens: logged, not raised
        await reporter.push()
        await reporter.push()
        assert reporter.push_delay() == 4.0  # backing off
        with FakeControlPlane(port=port) as server:
            await reporter.push()
            await reporter.push()  # nothing left to send
        await reporter.aclose()
        return rounds, server

    rounds, server = asyncio.run(scenario())
    assert len(server.received("samples")) == BUFFER_ROUNDS // ROUNDS_PER_POST
    stamps = [s["ts"] for s in _samples(server)]
    assert stamps == [samples[0]["ts"] for samples in rounds[20:]]  # the oldest 20 dropped


def test_samples_still_buffered_at_shutdown_are_sent_before_the_agent_stops(tmp_path):
    host = LocalHost(
        "h", SimBackend("h", MODELS["l4"], ["whole"]), SimRuntime(), StateStore(tmp_path)
    )
    identity = {"host_id": HOST_ID, "secret": HOST_SECRET}

    async def scenario(server):
        reporter = Reporter(host, {**identity, "server": server.url}, 5.0, "http://127.0.0.1:1")
        async with lifespan(host, 3600.0, reporter)(app=None):
            await asyncio.sleep(0.2)  # the loops' first rounds: a sample, then a push
            last = host.poll()
            reporter.add(last)  # the next push would be a second away: shutdown comes first
        return last

    with FakeControlPlane() as server:
        last = asyncio.run(scenario(server))
        assert [s["ts"] for s in _samples(server)][-1] == last[0]["ts"]

    with FakeControlPlane() as away:
        port = away.port
    stopping = time.monotonic()
    gone = FakeControlPlane(port=port)  # nobody listens there now: the flush gives up quickly
    asyncio.run(scenario(gone))
    assert time.monotonic() - stopping < 5
