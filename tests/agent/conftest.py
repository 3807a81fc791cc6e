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
