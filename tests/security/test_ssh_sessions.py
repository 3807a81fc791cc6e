"""SSH sessions end when their access or their client goes, leave nothing running in the
container or on the host, however their processes detach, and are capped per instance and per
key (issues: sessions were unbounded; exec monitors outlived them; a withdrawn key's session
kept running; a process started with setsid outlived its session)."""

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
from tests.security.gateway import until

pytestmark = [pytest.mark.integration, pytest.mark.containers]


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


# Ways a session's process leaves it: its own session (setsid), a daemon's double fork, nohup
# (SIGHUP ignored), and an attempt to move itself to the container's cgroup first. Each starts
# `sleep MARKER` (the demo image has busybox's applets, not all of them linked).
DETACHED = {
    "setsid": "busybox setsid sleep {} </dev/null >/dev/null 2>&1 &",
    "daemon": "(busybox setsid sh -c 'sleep {} </dev/null >/dev/null 2>&1 &' &)",
    "nohup": "(trap '' HUP; exec busybox setsid sleep {} </dev/null >/dev/null 2>&1) &",
    "cgroup": "for f in $(busybox find /sys/fs/cgroup -name cgroup.procs); do echo $$ > $f; done"
    " 2>/dev/null; busybox setsid sleep {} </dev/null >/dev/null 2>&1 &",
}


def _markers() -> dict[str, str]:
    return {way: f"sleep 1{secrets.randbelow(10**6):06d}" for way in DETACHED}


def _detach(markers: dict[str, str]) -> str:
    return "\n".join(DETACHED[way].format(m.split()[1]) for way, m in markers.items())


def test_what_a_session_leaves_running_ends_with_it_however_it_detached(gateway):
    """A command that detaches sleeps every way and exits, and a login shell whose profile
    (the tenant's file: it runs before the shell's first prompt) does the same: when each
    session ends, its sleeps end too, within seconds (the one that ignores SIGHUP after the
    grace)."""
    command = _markers()
    result = gateway.ssh(_detach(command) + "\nsleep 1; ps -o args")
    assert all(marker in result.stdout for marker in command.values()), result.stdout
    profile = _markers()
    script = _detach(profile).replace("'", "'\\''")
    assert gateway.inside(f"echo '{script}' > /etc/profile").returncode == 0

    async def login_shell():
        async with await gateway.connect() as conn:
            shell = await conn.create_process(term_type="xterm")
            until(lambda: all(gateway.runs(m) for m in profile.values()), 10, "profile")
            shell.stdin.write("exit\n")
            await asyncio.wait_for(shell.wait_closed(), 10)

    asyncio.run(login_shell())
    for way, marker in {**command, **profile}.items():
        until(lambda m=marker: not gateway.runs(m), HANGUP_GRACE_SECONDS + 3, f"{way} sleep ends")


def test_a_withdrawn_keys_open_session_ends_within_seconds_with_its_processes(gateway):
    laptop, desktop = f"sleep 4{secrets.randbelow(10**6)}", f"sleep 5{secrets.randbelow(10**6)}"
    detached = f"sleep 3{secrets.randbelow(10**6)}"

    async def sessions():
        async with (
            await gateway.connect("laptop") as withdrawn,
            await gateway.connect("desktop") as kept,
        ):
            gone = await withdrawn.create_process(f"setsid {detached} & {laptop}")
            stays = await kept.create_process(desktop)
            await asyncio.sleep(1)
            assert all(gateway.runs(m) for m in (laptop, desktop, detached))
            started = time.monotonic()
            await asyncio.to_thread(gateway.set_keys, "desktop")
            await asyncio.wait_for(gone.wait_closed(), 5)
            ended_in = time.monotonic() - started
            await asyncio.sleep(0.5)
            assert not stays.is_closing()
            assert (await kept.run("echo still here")).stdout == "still here\n"
            return ended_in

    assert asyncio.run(sessions()) < 3
    until(lambda: not gateway.runs(laptop), 3, "the withdrawn session's process ends")
    until(lambda: not gateway.runs(detached), 3, "and the one it started with setsid")
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
        until(lambda: len(_monitors(gateway)) >= MAX_SESSIONS_PER_KEY, 20, "all sessions open")
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
    until(lambda: gateway.runs(marker), 20, "the command runs")
    assert _monitors(gateway)
    client.send_signal(signal.SIGKILL)
    client.wait()
    grace = 2 if hangup == "dies" else HANGUP_GRACE_SECONDS + 3
    until(lambda: not gateway.runs(marker), grace, "the command is ended")
    until(lambda: not _monitors(gateway), 5, "no conmon of the session is left")
