"""Idle policies end to end: a real Celery worker and beat, a real agent with the sim backend
running real containers (Podman), whose GPU utilisation follows each container's CPU use. An
instance that sleeps is warned, then stopped at the time the warning said; one that spins is
left alone; an open SSH session through the agent's gateway keeps an instance from being idle;
the tenant keeps an instance running once, not twice; the operator's policy cannot be
weakened through the API."""

import shlex
import subprocess
import time
from datetime import datetime
from decimal import Decimal

import asyncssh
import pytest
import redis

from agent.devtools.engine import DEMO_IMAGE
from console import processes
from console.idle.models import OperatorPolicy
from tests.factories import ImageFactory
from tests.harness import running_stack
from tests.instances.conftest import STACK_ENV
from tests.instances.e2e import (
    api_client,
    make_catalog,
    make_tenant,
    start_agent,
    wait_for,
    wait_state,
)

pytestmark = [pytest.mark.integration, pytest.mark.containers, pytest.mark.timeout(400)]

SLEEPS = ["sleep", "infinity"]
SPINS = ["sh", "-c", "while :; do :; done"]
SSH_OPTIONS = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
               "-o", "BatchMode=yes", "-o", "LogLevel=ERROR"]  # fmt: skip


@pytest.fixture
def stack(transactional_db, redis_url, tmp_path, request, monkeypatch):
    """The instance tests' stack, plus Celery beat sending the idle watch's round every
    second."""
    redis.Redis.from_url(redis_url).flushdb()
    for name, value in {**STACK_ENV, "IDLE_CHECK_SECONDS": "1"}.items():
        monkeypatch.setenv(name, value)
    with running_stack(redis_url, tmp_path, request.node) as running:
        running.start("beat", processes.beat_cmd(tmp_path))
        yield running


@pytest.fixture
def cloud(stack, container_engine, tmp_path):
    """A tenant with an SSH key and an operator's idle policy of seconds (idle 6 s, then a
    6 s warning), a real container host, the demo image."""
    make_catalog()
    ImageFactory(name="demo-busybox", reference=DEMO_IMAGE, command=[], cuda_version="-")
    tenant, membership = make_tenant()
    OperatorPolicy.objects.create(
        tenant=tenant, window_minutes=Decimal("0.1"), warning_minutes=Decimal("0.1")
    )
    api = api_client(stack, membership)
    key = asyncssh.generate_private_key("ssh-ed25519", comment="laptop")
    private = tmp_path / "laptop"
    private.write_bytes(key.export_private_key())
    private.chmod(0o600)
    added = api.post(
        "/ssh-keys/", json={"name": "laptop", "public_key": key.export_public_key().decode()}
    )
    assert added.status_code == 201, added.text
    start_agent(stack, "gpu-1", gpus=2, runtime="oci", engine_url=container_engine.url)
    return {"api": api, "key": private}


def launch(api, name: str, command: list[str]) -> int:
    body = {"name": name, "spec": "a100-quarter", "image": "demo-busybox", "command": command}
    created = api.post("/instances/", json=body)
    assert created.status_code == 202, created.text
    return created.json()["id"]


def events(api, iid: int) -> list[dict]:
    return api.get(f"/instances/{iid}/events/", params={"limit": 200}).json()["results"]


def warnings(api, iid: int) -> list[dict]:
    return [e for e in events(api, iid) if e["message"].startswith("Idle policy warning")]


def at(event: dict) -> float:
    return datetime.fromisoformat(event["at"]).timestamp()


def test_an_idle_instance_is_warned_then_stopped_and_a_busy_one_is_not(stack, cloud):
    api = cloud["api"]
    idler, spinner = launch(api, "idler", SLEEPS), launch(api, "spinner", SPINS)
    for iid in (idler, spinner):
        wait_state(api, iid, "running", stack, timeout=120)

    # the operator's policy cannot be weakened by the tenant
    weaker = api.put(f"/instances/{idler}/idle-policy/", json={"window_minutes": "60"})
    assert weaker.status_code == 400
    assert "window_minutes" in weaker.json()["errors"]
    shown = api.get(f"/instances/{idler}/idle-policy/").json()
    assert shown["in_force"]["window_minutes"] == "0.10" and shown["in_force"]["action"] == "stop"

    stopped = wait_state(api, idler, "stopped", stack, timeout=120)
    assert stopped["state_reason"].startswith("idle_stopped: idle since")
    (warning,) = warnings(api, idler)
    assert "Stop at" in warning["message"] and "GPU at most" in warning["message"]
    stopping = next(e for e in events(api, idler) if e["to_state"] == "stopping")
    assert "GPU at most" in stopping["message"] and "(under 5 %)" in stopping["message"]
    # acted at the time the warning said: its whole lead after it, not before
    assert at(stopping) - at(warning) >= 5.5
    said = warning["message"].split("Stop at ")[1][:8]
    assert datetime.fromisoformat(stopping["at"]).strftime("%H:%M:%S") >= said

    # the spinner's GPU reads busy: no warning, still running
    assert warnings(api, spinner) == []
    assert api.get(f"/instances/{spinner}/").json()["state"] == "running"
    assert api.get(f"/instances/{spinner}/idle-policy/").json()["warned"] is False
    # its busy loop would take a core from every test after this one
    assert api.post(f"/instances/{spinner}/terminate/").status_code == 202
    wait_state(api, spinner, "terminated", stack, timeout=120)


def test_keep_running_works_once_per_run(stack, cloud):
    api = cloud["api"]
    iid = launch(api, "kept", SLEEPS)
    wait_state(api, iid, "running", stack, timeout=120)
    wait_for(lambda: warnings(api, iid), timeout=60, what="the warning", stack=stack, interval=0.5)
    kept = api.post(f"/instances/{iid}/keep-running/")
    assert kept.status_code == 200, kept.text
    assert kept.json()["warned"] is False
    wait_for(lambda: len(warnings(api, iid)) == 2, timeout=60, what="a second warning", stack=stack)
    again = api.post(f"/instances/{iid}/keep-running/")
    assert again.status_code == 409 and again.json()["code"] == "kept_running_already"
    wait_state(api, iid, "stopped", stack, timeout=60)


def test_an_open_ssh_session_keeps_it_from_being_idle(stack, cloud):
    api = cloud["api"]
    iid = launch(api, "shell", SLEEPS)
    instance = wait_state(api, iid, "running", stack, timeout=120)
    command = shlex.split(instance["ssh"]["command"])
    login = [command[0], "-i", str(cloud["key"]), *SSH_OPTIONS, *command[1:]]
    session = subprocess.Popen([*login, "sleep 30"])
    try:
        wait_for(
            lambda: any("ssh session" in e["message"] for e in events(api, iid)),
            timeout=30, what="the ssh session", stack=stack, interval=0.5,
        )  # fmt: skip
        time.sleep(20)  # idle GPU for longer than the window and its warning
        assert warnings(api, iid) == []
        assert api.get(f"/instances/{iid}/").json()["state"] == "running"
        assert api.get(f"/instances/{iid}/idle-policy/").json()["acts_at"] is None
    finally:
        session.wait(timeout=60)
    # the session over, the idle watch goes on from its end
    stopped = wait_state(api, iid, "stopped", stack, timeout=120)
    assert stopped["state_reason"].startswith("idle_stopped")
