"""An agent upgrade keeps the workloads (issue 26, items 1 and 3), with the real stack, a real
agent and real containers: the agent is SIGKILLed and stays down for longer than the old
60 s failover time, then starts again from its state directory. Its container, its processes
and the ways in (ssh, the terminal, the port) come back untouched, the instance goes
`running` → `unreachable` → `running`, and billing covers the run once, without a gap."""

import asyncio
import shlex
import subprocess
import time
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import asyncssh
import docker
import httpx
import pytest
import websockets

from agent.devtools.engine import DEMO_IMAGE
from billing.models import UsageSegment
from console.fleet import services as fleet
from console.fleet.models import Host
from console.instances import recovery, tasks
from console.instances.models import Instance, State
from tests.factories import ImageFactory
from tests.instances.e2e import api_client, make_catalog, make_tenant, start_agent, wait_for
from tests.instances.e2e import wait_state as wait_api_state

pytestmark = [pytest.mark.integration, pytest.mark.containers, pytest.mark.timeout(600)]
SSH_OPTIONS = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
               "-o", "BatchMode=yes", "-o", "LogLevel=ERROR"]  # fmt: skip
OLD_FAILOVER_SECONDS = 60


def _ssh(api, iid, key, command: str) -> subprocess.CompletedProcess:
    ssh = api.get(f"/instances/{iid}/").json()["ssh"]
    login = ["ssh", "-i", str(key), *SSH_OPTIONS, *shlex.split(ssh["command"])[1:]]
    return subprocess.run([*login, command], capture_output=True, text=True, timeout=60)


def _terminal(stack, api, iid) -> bytes:
    url = f"ws://127.0.0.1:{stack.port}/ws/instances/{iid}/terminal/"
    token = api.headers["Authorization"]

    async def session() -> bytes:
        async with websockets.connect(url, additional_headers={"Authorization": token}) as ws:
            await ws.send(b"echo $((6*7))\r")
            seen = b""
            while b"42\r\n" not in seen:
                seen += await asyncio.wait_for(ws.recv(), 20)
            return seen

    return asyncio.run(session())


def _port_page(stack, api, iid) -> httpx.Response:
    (port,) = api.get(f"/instances/{iid}/").json()["ports"]
    origin = urlsplit(port["origin_url"]).netloc
    headers = {"Host": origin, "Authorization": api.headers["Authorization"]}
    return wait_for(
        lambda: (
            (r := httpx.get(f"{stack.url}/", headers=headers, timeout=10)).status_code == 200 and r
        ),
        timeout=60,
        what="the container's web server through its port",
    )


def _container(engine_url: str, iid: int) -> dict:
    client = docker.DockerClient(base_url=engine_url)
    try:
        return client.containers.get(f"gpucloud-{iid}").attrs
    finally:
        client.close()


def _processes(pid: int) -> set[tuple[int, str]]:
    """The container's processes as the host sees them (its init `pid` and its descendants):
    each one's pid and start time (in clock ticks after boot), so that a restart shows."""
    found = set()
    todo = [pid]
    while todo:
        current = todo.pop()
        stat = Path(f"/proc/{current}/stat").read_text()
        found.add((current, stat.rpartition(")")[2].split()[19]))
        for task in Path(f"/proc/{current}/task").iterdir():
            todo += [int(child) for child in (task / "children").read_text().split()]
    return found


def test_an_agent_down_longer_than_the_old_failover_time_keeps_its_work(
    stack, container_engine, tmp_path
):
    make_catalog()
    ImageFactory(
        name="demo-busybox", reference=DEMO_IMAGE, command=[], cuda_version="-",
        ports=[{"port": 8888, "name": "web"}],
    )  # fmt: skip
    _, membership = make_tenant()
    api = api_client(stack, membership)
    key = asyncssh.generate_private_key("ssh-ed25519", comment="laptop")
    private = tmp_path / "laptop"
    private.write_bytes(key.export_private_key())
    private.chmod(0o600)
    public = key.export_public_key().decode()
    assert api.post("/ssh-keys/", json={"name": "laptop", "public_key": public}).status_code == 201
    agent, host = start_agent(
        stack, "gpu-1", gpus=2, runtime="oci", engine_url=container_engine.url
    )
    created = api.post(
        "/instances/", json={"name": "trainer", "spec": "a100-quarter", "image": "demo-busybox"}
    )
    assert created.status_code == 202, created.text
    iid = created.json()["id"]
    wait_api_state(api, iid, "running", stack, timeout=120)
    before = _container(container_engine.url, iid)
    processes = _processes(before["State"]["Pid"])
    assert len(processes) >= 2  # its init and the web server
    assert _port_page(stack, api, iid).status_code == 200
    ran_at = Instance.objects.get(pk=iid).events.get(from_state=State.PROVISIONING).at
    wait_for(lambda: Host.objects.get(pk=host.pk).last_heartbeat_at > ran_at, what="a heartbeat")

    # the agent is killed (an upgrade: stop it, replace it, start it) and stays down longer
    # than the old failover time, while the watchdog and the failover run as the beat runs them
    agent.kill()
    killed = time.monotonic()
    while time.monotonic() - killed < OLD_FAILOVER_SECONDS + 5:
        fleet.mark_silent_hosts_unreachable()
        recovery.fail_over_hosts()
        time.sleep(1)
    host.refresh_from_db()
    assert host.status == Host.Status.UNREACHABLE
    silent = Instance.objects.get(pk=iid)
    assert silent.state == State.UNREACHABLE
    assert silent.state_reason.startswith("host_unreachable: host gpu-1 not heard since ")
    shown = api.get(f"/instances/{iid}/").json()
    assert (shown["state"], shown["state_reason"]) == ("unreachable", silent.state_reason)
    assert silent.events.last().at == host.last_heartbeat_at  # billing stops there
    assert _container(container_engine.url, iid)["State"]["Running"]

    # the new agent starts from the same state directory
    stack.start_agent(
        "gpu-1", region="local-1", gpus=2, mode="shared,mig", runtime="oci",
        engine_url=container_engine.url,
    )  # fmt: skip
    wait_for(
        lambda: Host.objects.get(pk=host.pk).status == Host.Status.ACTIVE,
        timeout=60,
        what="the host heard again",
        stack=stack,
    )
    wait_for(lambda: tasks.reconcile_host(host.pk).get("adopted") == [iid], timeout=60,
             what="the instance adopted back", stack=stack)  # fmt: skip
    back = Instance.objects.get(pk=iid)
    assert back.state == State.RUNNING
    assert "adopted, not restarted" in back.events.last().message
    assert wait_api_state(api, iid, "running", stack)["state_reason"] == ""

    # the same container, the same processes, the same start time
    after = _container(container_engine.url, iid)
    assert after["Id"] == before["Id"]
    assert after["State"]["StartedAt"] == before["State"]["StartedAt"]
    assert after["State"]["Pid"] == before["State"]["Pid"]
    assert _processes(after["State"]["Pid"]) == processes
    shell = _ssh(api, iid, private, "echo $((6*7))")
    assert (shell.returncode, shell.stdout) == (0, "42\n"), shell.stderr
    assert b"42" in _terminal(stack, api, iid)
    assert _port_page(stack, api, iid).status_code == 200
    assert Instance.objects.get(pk=iid).events.filter(to_state=State.FAILED).count() == 0

    # billed once, without a gap: up to the last heartbeat, then on from there
    heard = host.last_heartbeat_at
    segments = list(UsageSegment.objects.filter(instance_id=iid, kind="gpu").order_by("started_at"))
    assert [(s.started_at, s.ended_at) for s in segments] == [(ran_at, heard), (heard, None)]
    assert heard - ran_at < timedelta(seconds=OLD_FAILOVER_SECONDS)
