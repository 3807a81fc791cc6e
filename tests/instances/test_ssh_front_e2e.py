"""One ssh line for an instance wherever it runs, end to end: the console's SSH front, two real
container hosts whose gateways hold host certificates of the console's CA, and OpenSSH as the
client with nothing in its known_hosts but the two lines the console gives. The instance is
shelved on one host and started on the other: the same line, the same known_hosts, its data."""

import secrets
import shlex
import subprocess
from pathlib import Path

import asyncssh
import pytest

from agent.devtools.engine import DEMO_IMAGE
from cli import ssh as cli_ssh
from console import processes
from console.fleet.models import Host
from console.instances.models import Allocation
from console.snapshots.models import Shelf
from tests.factories import ImageFactory
from tests.instances.e2e import (
    api_client,
    make_catalog,
    make_tenant,
    start_agent,
    wait_for,
    wait_state,
)

pytestmark = [pytest.mark.integration, pytest.mark.containers, pytest.mark.timeout(400)]


@pytest.fixture
def stack_env(tmp_path):
    """The stack's processes run an SSH front on a port of their own, with keys of this test."""
    return {
        "SSH_FRONT": f"127.0.0.1:{processes.free_port()}",
        "SSH_CA_KEY_FILE": str(tmp_path / "ssh-ca-key"),
        "SSH_FRONT_HOST_KEY_FILE": str(tmp_path / "ssh-front-host-key"),
        "SNAPSHOT_REPOSITORY": str(tmp_path / "restic"),
        "SNAPSHOT_MASTER_SECRET": "e2e-snapshot-master-secret-of-32-characters-at-least",
    }


def _set_status(host: Host, status: str) -> None:
    Host.objects.filter(pk=host.pk).update(admin_status=status, status=status)


def _certified(host: Host) -> bool:
    return Host.objects.get(pk=host.pk).ssh_certificate_expires_at is not None


def _ssh_config(tmp_path: Path, key: Path, known_hosts: Path) -> Path:
    """What a user's ~/.ssh holds: their key, and the console's known_hosts lines, checked
    strictly on both hops (ssh gives -F to the jump too)."""
    config = tmp_path / "ssh_config"
    config.write_text(
        "Host *\n"
        f"  IdentityFile {key}\n  IdentitiesOnly yes\n  UserKnownHostsFile {known_hosts}\n"
        "  StrictHostKeyChecking yes\n  BatchMode yes\n  LogLevel ERROR\n"
    )
    return config


def _run(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (argv, done.stdout, done.stderr)
    return done.stdout


def test_the_ssh_line_and_known_hosts_stay_when_an_unshelve_moves_the_instance(
    stack, container_engine, tmp_path
):
    make_catalog()
    ImageFactory(name="demo-busybox", reference=DEMO_IMAGE, command=["sleep", "100000"],
                 cuda_version="-")  # fmt: skip
    _, membership = make_tenant()
    api = api_client(stack, membership)
    key = asyncssh.generate_private_key("ssh-ed25519", comment="laptop")
    private = tmp_path / "laptop"
    private.write_bytes(key.export_private_key())
    private.chmod(0o600)
    public = key.export_public_key().decode()
    assert api.post("/ssh-keys/", json={"name": "laptop", "public_key": public}).status_code == 201
    stack.start("ssh-front", [processes.PYTHON, "manage.py", "ssh_front"]).wait_for_log(
        "SSH front on"
    )
    first = start_agent(stack, "gpu-1", gpus=2, runtime="oci", engine_url=container_engine.url)[1]
    second = start_agent(stack, "gpu-2", gpus=2, runtime="oci", engine_url=container_engine.url)[1]
    _set_status(second, Host.Status.CORDONED)
    body = {"name": "keeper", "spec": "a100-quarter", "image": "demo-busybox"}
    iid = api.post("/instances/", json=body).json()["id"]
    before = wait_state(api, iid, "running", stack, timeout=60)["ssh"]
    front = stack.env["SSH_FRONT"]
    assert before["command"] == f"ssh -J {iid}@{front} {iid}@gpucloud"
    wait_for(lambda: _certified(first) and _certified(second), what="gateways certified",
             stack=stack)  # fmt: skip

    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("".join(f"{line}\n" for line in before["known_hosts"]))
    config = _ssh_config(tmp_path, private, known_hosts)
    line = ["ssh", "-F", str(config), *shlex.split(before["command"])[1:]]
    note = secrets.token_hex(8)
    assert _run([*line, f"echo {note} > /workspace/note; cat /workspace/note"]) == f"{note}\n"
    cli_known_hosts = tmp_path / "cli" / "known_hosts"  # `gpucloud ssh`'s own file and argv
    cli_ssh.pin_host_key(before, cli_known_hosts)
    cli_line = cli_ssh.ssh_argv(before, cli_known_hosts, str(private), ["BatchMode=yes"], [])
    assert _run([*cli_line, "cat /workspace/note"]) == f"{note}\n"

    # shelved off gpu-1, started on gpu-2
    assert api.post(f"/instances/{iid}/stop/").status_code == 202
    wait_state(api, iid, "stopped", stack)
    assert api.post(f"/instances/{iid}/shelve/").status_code == 202
    wait_for(lambda: Shelf.objects.filter(instance_id=iid, state=Shelf.State.SHELVED).exists(),
             timeout=90, what="shelved", stack=stack)  # fmt: skip
    _set_status(first, Host.Status.CORDONED)
    _set_status(second, Host.Status.ACTIVE)
    assert api.post(f"/instances/{iid}/start/").status_code == 202
    after = wait_state(api, iid, "running", stack, timeout=120)["ssh"]
    moved = Allocation.objects.get(instance_id=iid, released_at__isnull=True)
    assert moved.host_id == second.pk

    assert after == before  # the same line, the same known_hosts lines
    assert _run([*line, "cat /workspace/note"]) == f"{note}\n"
    assert _run([*cli_line, "cat /workspace/note"]) == f"{note}\n"
    events = [e["message"] for e in api.get(f"/instances/{iid}/events/").json()["results"]]
    assert any("ssh session" in m and "with key laptop" in m for m in events), events
