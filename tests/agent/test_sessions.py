"""agent/sessions.py on its own (the real path, sessions in real containers, is
tests/security/test_ssh_sessions.py's and test_terminal_sessions.py's): nothing is done to a
process that is not of the container, whatever pid the engine names."""

import subprocess

import pytest

from agent.sessions import SessionGroup, Untracked

pytestmark = pytest.mark.integration


def test_a_process_outside_the_containers_pid_namespace_is_left_alone():
    host_process = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(Untracked, match="not of the container"):
            SessionGroup.enter(host_process.pid, host_process.pid)  # the agent's namespace
        assert host_process.poll() is None
    finally:
        host_process.kill()
        host_process.wait()
    with pytest.raises(ProcessLookupError):  # gone: Shell.open refuses the session (503)
        SessionGroup.enter(host_process.pid, 1)
