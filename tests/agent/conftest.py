"""Fixtures of the agent's tests."""

from pathlib import Path

import pytest

from tests.agent.agents import SECRET, Agent


@pytest.fixture
def start_agent(tmp_path):
    """Start agents (`start_agent("--gpus", "2", ...)`); all are killed after the test."""
    agents: list[Agent] = []

    def start(*args: str, state_dir: Path | None = None, secret: str | None = SECRET, wait=True):
        agent = Agent(state_dir or tmp_path / "state", args, secret)
        agents.append(agent)
        if wait:
            agent.wait_ready()
        return agent

    yield start
    for agent in agents:
        agent.kill()
        agent.reap_workloads()
        agent.client.close()


@pytest.fixture
def nvml(monkeypatch):
    """make([gpu dicts], modes=None, manage_mig=False, **backend options) -> (fake, backend):
    an NvmlBackend on tests.agent.fake_nvml (root unless `access` says otherwise, no DCGM)."""
    from agent.backends import nvml as nvml_backend
    from agent.backends.nvml.access import MigAccess
    from tests.agent.fake_nvml import FakeNvml

    backends = []

    def make(gpus, modes=None, manage_mig=False, **options):
        fake = FakeNvml(gpus)
        monkeypatch.setattr(nvml_backend, "pynvml", fake.module)
        options.setdefault("dcgm", None)
        options.setdefault(
            "access", MigAccess(root=True, cap_sys_admin=True, config=None, monitor=None)
        )
        backend = nvml_backend.NvmlBackend(modes, manage_mig, **options)
        backend.release_pause = 0
        backends.append(backend)
        return fake, backend

    yield make
    for backend in backends:
        backend.close()
