"""SSH sessions end when their access or their client goes, leave nothing running in the
container or on the host, and are capped per instance and per key (issues: sessions were
unbounded; exec monitors outlived them; a withdrawn key's session kept running)."""

import asyncio
import secrets
import signal
import subprocess
import time

import asyncssh
import docker
import pytest

from agent.shell import HANGUP_GRACE_SECONDS
from agent.ssh import MAX_SESSIONS_PER_KEY

pytestmark = [pytest.mark.integration, pytest.mark.containers]


def _until(check, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while not (result := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds} s: {what}")
        time.sleep(0.2)
    return result


def _running(gateway, marker: str) -> bool:
    """Whether a process of the container has `marker` in its command line (`ps` inside)."""
    listed = gateway.inside("ps -o args")
    assert listed.returncode == 0, listed.stderr
    return marker in listed.stdout


def _monitors(gateway) -> list[str]:
    """The host's conmon processes of the instance's exec sessions (not the container's own)."""
    client = docker.DockerClient(base_url=gateway.engine.url)
    try:
        container_id = client.containers.get(f"gpucloud-{gateway.instance}").id
    finally:
        client.close()
    listed = subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [
        line for line in listed.splitlines()
        if "conmon" in line and container_id in line and "--exec-attach" in line
    ]  # fmt: skip


def test_a_withdrawn_keys_open_session_ends_within_seconds_with_its_processes(gateway):
    laptop, desktop = f"sleep 4{secrets.randbelow(10**6)}", f"sleep 5{secrets.randbelow(10**6)}"

    async def sessions():
        async with (
            await gateway.connect("laptop") as withdrawn,
            await gateway.connect("desktop") as kept,
        ):
            gone = await withdrawn.create_process(laptop)
            stays = await kept.create_process(desktop)
            await asyncio.sleep(1)
            assert _running(gateway, laptop) and _running(gateway, desktop)
            started = time.monotonic()
            await asyncio.to_thread(gateway.set_keys, "desktop")
            await asyncio.wait_for(gone.wait_closed(), 5)
            ended_in = time.monotonic() - started
            await asyncio.sleep(0.5)
            assert not stays.is_closing()
            assert (await kept.run("echo still here")).stdout == "still here\n"
            return ended_in

    assert asyncio.run(sessions()) < 3
    _until(lambda: not _running(gateway, laptop), 3, "the withdrawn session's process ends")
    with pytest.raises(asyncssh.PermissionDenied):
        asyncio.run(gateway.connect("laptop"))


def test_sessions_over_the_per_key_cap_are_refused(gateway):
    async def sessions():
        async with await gateway.connect() as conn:
            held = [await conn.create_process("sleep 300") for _ in range(MAX_SESSIONS_PER_KEY)]
            over = await conn.run("echo one too many")
            for process in held:
                process.close()
            return over

    over = asyncio.run(sessions())
    assert over.exit_status == 1 and over.stdout == ""
    assert f"this key has {MAX_SESSIONS_PER_KEY} SSH sessions open" in over.stderr

    clients = [gateway.ssh_background("sleep 300") for _ in range(MAX_SESSIONS_PER_KEY)]
    try:
        _until(lambda: len(_monitors(gateway)) >= MAX_SESSIONS_PER_KEY, 20, "all sessions open")
        refused = gateway.ssh("echo one too many")
        assert refused.returncode == 255 and "one too many" not in refused.stdout
        assert f"this key has {MAX_SESSIONS_PER_KEY} SSH connections open" in refused.stderr
        assert gateway.ssh("echo another key", key="desktop").stdout == "another key\n"
    finally:
        for client in clients:
            client.kill()


@pytest.mark.parametrize("hangup", ["dies", "ignored"])
def test_a_client_killed_leaves_nothing_running_in_the_container_or_on_the_host(gateway, hangup):
    """kill -9 of OpenSSH's client: the command gets SIGHUP (and SIGKILL after the grace when
    it ignores it); no conmon of the session stays on the host."""
    marker = f"sleep 6{secrets.randbelow(10**6)}"
    command = marker if hangup == "dies" else f"trap '' HUP; exec {marker}"
    client = gateway.ssh_background(command)
    _until(lambda: _running(gateway, marker), 20, "the command runs")
    assert _monitors(gateway)
    client.send_signal(signal.SIGKILL)
    client.wait()
    grace = 2 if hangup == "dies" else HANGUP_GRACE_SECONDS + 3
    _until(lambda: not _running(gateway, marker), grace, "the command is ended")
    _until(lambda: not _monitors(gateway), 5, "no conmon of the session is left")
