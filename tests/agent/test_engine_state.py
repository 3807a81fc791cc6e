"""The agent tells the console in each heartbeat whether its container engine answers (issue 50
item 2), logs an outage once when it begins and once when it ends (not every second), and
reads its workloads again before it says the engine is back."""

import asyncio
import logging

from agent.backends.sim import SimBackend
from agent.control import Reporter
from agent.gpu_models import MODELS
from agent.host import LocalHost
from agent.runtimes.engine_state import EngineState
from agent.runtimes.sim import SimRuntime
from agent.state import StateStore
from tests.agent.fake_control_plane import HOST_ID, HOST_SECRET, FakeControlPlane


class EngineRuntime(SimRuntime):
    """A runtime with an engine that answers while `answers` is set."""

    def __init__(self):
        super().__init__()
        self.answers = True
        self.refreshed = 0
        self.engine_state = EngineState("unix:///run/engine.sock", clock=lambda: 1000.0)

    def check_engine(self) -> dict:
        if self.answers:
            self.engine_state.answered()
        else:
            self.engine_state.failed(ConnectionRefusedError(111, "Connection refused"))
        return self.engine_state.report()

    def refresh(self, allocations) -> None:
        if not self.answers:
            raise ConnectionRefusedError(111, "Connection refused")
        self.refreshed += 1


def test_an_outage_is_logged_once_each_way_and_reported_as_it_is(caplog):
    state = EngineState("unix:///e.sock", clock=lambda: 50.0)
    assert state.report() == {"state": "up"}
    with caplog.at_level(logging.WARNING, logger="agent.runtimes.engine_state"):
        for _ in range(5):
            state.failed(OSError("refused"))
        assert state.down
        assert state.report() == {"state": "down", "since": 50.0, "detail": "refused"}
        for _ in range(3):
            state.answered()
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "the container engine at unix",
        "the container engine at unix",
    ]
    assert "does not answer" in caplog.records[0].getMessage()
    assert "answers again" in caplog.records[1].getMessage()
    assert state.report() == {"state": "up"}


def test_heartbeats_carry_the_engine_and_the_loops_stay_quiet_while_it_is_down(tmp_path, caplog):
    runtime = EngineRuntime()
    host = LocalHost("h", SimBackend("h", MODELS["l4"], ["whole"]), runtime, StateStore(tmp_path))
    identity = {"host_id": HOST_ID, "secret": HOST_SECRET}

    async def scenario(server):
        reporter = Reporter(host, {**identity, "server": server.url}, 5.0, "http://127.0.0.1:1")
        await reporter.heartbeat()
        runtime.answers = False
        for _ in range(5):  # a sampling round every second
            assert not await host.refresh()
        await reporter.heartbeat()
        refreshed = runtime.refreshed
        runtime.answers = True
        await reporter.heartbeat()  # it reads the workloads before it says the engine is up
        assert runtime.refreshed == refreshed + 1
        await reporter.aclose()

    with caplog.at_level(logging.WARNING), FakeControlPlane() as server:
        asyncio.run(scenario(server))
        beats = [body["engine"] for _, body in server.received("heartbeat")]
    assert beats == [
        {"state": "up"},
        {"state": "down", "since": 1000.0, "detail": "[Errno 111] Connection refused"},
        {"state": "up"},
    ]
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len([m for m in warned if "does not answer" in m]) == 1
    assert not [m for m in warned if "cannot read the workloads" in m]


def test_a_runtime_without_an_engine_sends_none(tmp_path):
    host = LocalHost(
        "h", SimBackend("h", MODELS["l4"], ["whole"]), SimRuntime(), StateStore(tmp_path)
    )
    assert asyncio.run(host.engine()) is None
