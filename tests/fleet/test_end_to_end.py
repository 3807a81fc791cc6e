"""Real agent processes against the real control plane (uvicorn + Celery worker): register,
heartbeat health, the watchdog, restarts, used tokens, and a race through the HTTP server."""

import html
import os
import re
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from django.test import Client

from console import processes
from console.fleet import agent_client, services, tasks
from console.fleet.models import Gpu, Host
from tests.factories import GpuModelFactory, RegionFactory, UserFactory

pytestmark = [pytest.mark.integration]


def wait_for(check, timeout=20.0, what="condition", stack=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    logs = stack.logs() if stack is not None else ""
    raise AssertionError(f"timed out waiting for {what}\n{logs}")


def answers(host) -> bool:
    """The agent's API is up, and takes the secret the control plane holds."""
    try:
        return len(agent_client.inventory(Host.objects.get(pk=host.pk))["gpus"]) > 0
    except agent_client.AgentUnavailable:
        return False


@pytest.fixture
def catalog(transactional_db):
    region = RegionFactory(code="local-1", name="Local 1")
    GpuModelFactory()
    GpuModelFactory(code="h100-80gb", name="NVIDIA H100 80GB", memory_mib=81559)
    return region


def test_agent_lifecycle(stack, catalog, settings):
    token, raw = services.create_join_token(catalog, note="e2e")
    agent = stack.start_agent(
        "gpu-e2e", region="local-1", gpus=4, mode="mig,mig,shared,whole", join_token=raw
    )
    host = wait_for(
        lambda: Host.objects.filter(name="gpu-e2e").first(), what="registration", stack=stack
    )
    assert host.region == catalog and host.backend == "sim" and host.vcpus > 0
    gpus = list(host.gpus.order_by("index"))
    assert [(g.model.code, g.mode) for g in gpus] == [
        ("a100-80gb", "mig"),
        ("a100-80gb", "mig"),
        ("a100-80gb", "shared"),
        ("a100-80gb", "whole"),
    ]
    assert all(g.healthy and g.uuid.startswith("GPU-") for g in gpus)
    token.refresh_from_db()
    assert token.host == host

    # the control plane speaks to the agent with the secret it handed out
    wait_for(lambda: answers(host), what="the agent's API", stack=stack)

    # a GPU falls off the bus; the heartbeat (and the samples) tell the control plane
    agent_client.inject_fault(host, 1, "xid79")
    gpu = wait_for(
        lambda: Gpu.objects.filter(host=host, index=1, healthy=False).first(),
        what="GPU 1 unhealthy",
        stack=stack,
    )
    wait_for(
        lambda: Gpu.objects.get(pk=gpu.pk).health_reason.startswith("xid79"),
        what="the heartbeat's reason",
        stack=stack,
    )
    agent_client.inject_fault(host, 1, "clear")
    wait_for(lambda: Gpu.objects.get(pk=gpu.pk).healthy, what="GPU 1 healed", stack=stack)

    # the agent goes silent: the watchdog marks the host unreachable
    services.set_host_status(host, Host.Status.CORDONED)
    agent.kill()
    settings.HOST_HEARTBEAT_GRACE_SECONDS = 1.0
    time.sleep(1.5)
    assert tasks.watchdog() == ["gpu-e2e"]
    host.refresh_from_db()
    assert host.status == Host.Status.UNREACHABLE and host.unreachable_since is not None

    # it restarts from its state directory: no second registration, back to its status
    stack.start_agent("gpu-e2e", region="local-1", gpus=4, mode="mig,mig,shared,whole")
    wait_for(
        lambda: Host.objects.get(pk=host.pk).status == Host.Status.CORDONED,
        what="host back from unreachable",
        stack=stack,
    )
    assert Host.objects.count() == 1
    host.refresh_from_db()
    assert host.unreachable_since is None

    # the used token again, from another machine: refused, and the agent exits non-zero
    other = stack.start_agent("gpu-other", region="local-1", gpus=1, join_token=raw)
    other.popen.wait(timeout=20)
    assert other.returncode != 0
    assert "already used" in other.log()
    assert not Host.objects.filter(name="gpu-other").exists()


def test_two_agents_racing_with_one_token_through_the_server(stack, catalog):
    _, raw = services.create_join_token(catalog)
    barrier = threading.Barrier(2)
    answers = {}

    def register(hostname):
        body = {
            "join_token": raw,
            "hostname": hostname,
            "address": "http://127.0.0.1:9",
            "region": "",
            "agent_version": "test",
            "inventory": {
                "gpus": [
                    {
                        "index": 0,
                        "uuid": f"GPU-{hostname}",
                        "model": "h100-80gb",
                        "mode": "whole",
                        "healthy": True,
                        "memory_mib": 81559,
                    }  # fmt: skip
                ]
            },
        }
        barrier.wait(timeout=10)
        answers[hostname] = httpx.post(f"{stack.url}/agent/v1/register", json=body, timeout=30)

    threads = [threading.Thread(target=register, args=(n,)) for n in ("race-a", "race-b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    codes = sorted(r.status_code for r in answers.values())
    assert codes == [201, 403], {n: r.text for n, r in answers.items()}
    assert Host.objects.filter(name__startswith="race-").count() == 1


def test_the_join_command_copied_from_the_fleet_page_joins_the_host(stack, catalog, tmp_path):
    operator = Client()
    operator.force_login(UserFactory(username="ops", is_staff=True))
    port = processes.free_port()
    page = operator.post(
        "/fleet/join-tokens/",
        {
            "region": catalog.pk, "backend": "sim", "runtime": "process", "address": "127.0.0.1",
            "port": port, "state_dir": str(tmp_path / "agent-state"), "gpus": 2,
            "model": "h100-80gb",
        },
        HTTP_HOST=stack.url.removeprefix("http://"),  # the console as the operator reached it
    ).content.decode()  # fmt: skip
    command = html.unescape(re.search(r'data-testid="join-command">([^<]+)</pre>', page).group(1))
    assert command.startswith(f"gpucloud-agent --server {stack.url} \\\n  --join-token gpj_")
    # pasted into a shell on the new host, where gpucloud-agent is installed
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    stack.start("agent-pasted", ["bash", "-c", command], PATH=path)
    host = wait_for(
        lambda: Host.objects.filter(address=f"http://127.0.0.1:{port}").first(),
        timeout=60,
        what="the pasted command to register its host",
        stack=stack,
    )
    assert host.region == catalog and host.backend == "sim" and host.runtime == "process"
    assert [gpu.model.code for gpu in host.gpus.order_by("index")] == ["h100-80gb"] * 2
    wait_for(lambda: answers(host), what="the agent to answer", stack=stack)
