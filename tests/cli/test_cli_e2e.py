"""The `gpucloud` command end to end, as a user runs it (a process of its own): against the
real stack (ASGI server, Celery worker) and a real agent running containers on Podman, with
OpenSSH through the agent's SSH gateway."""

import os
import subprocess
import sys

import asyncssh
import pytest

from accounts import services as accounts
from agent.devtools.engine import DEMO_IMAGE
from console.fleet.models import Host
from tests.factories import ImageFactory
from tests.instances.e2e import make_catalog, make_tenant, start_agent

pytestmark = [pytest.mark.integration, pytest.mark.containers]


@pytest.fixture
def gpucloud(stack, container_engine, tmp_path):
    """Runs `gpucloud ARGS…` as a user would, logged in as a member of a tenant with a host of
    real containers; HOME is empty, so nothing of this machine's ~/.ssh is used."""
    make_catalog()
    ImageFactory(name="demo-busybox", reference=DEMO_IMAGE, command=[], cuda_version="-")
    _, membership = make_tenant()
    start_agent(stack, "gpu-1", gpus=2, runtime="oci", engine_url=container_engine.url)
    home = tmp_path / "home"
    home.mkdir()
    env = {
        **os.environ,
        "HOME": str(home),
        "GPUCLOUD_URL": stack.url,
        "GPUCLOUD_TOKEN": accounts.issue_token(membership.user, membership.tenant, "cli").raw,
        "GPUCLOUD_CONFIG": str(home / ".config" / "gpucloud" / "config.json"),
    }

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "cli.main", *args],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    return run


@pytest.fixture
def laptop_key(gpucloud, tmp_path):
    """A private key whose public half is the tenant member's key `laptop`."""
    key = asyncssh.generate_private_key("ssh-ed25519")
    (tmp_path / "laptop.pub").write_bytes(key.export_public_key())
    private = tmp_path / "laptop"
    private.write_bytes(key.export_private_key())
    private.chmod(0o600)
    assert gpucloud("ssh-keys", "add", "laptop", str(tmp_path / "laptop.pub")).returncode == 0
    return private


def test_launch_wait_then_ssh_with_the_pinned_host_key(gpucloud, laptop_key, tmp_path):
    launched = gpucloud(
        "launch", "nb", "--spec", "a100-quarter", "--image", "demo-busybox", "--wait"
    )  # fmt: skip
    assert launched.returncode == 0, launched.stderr
    states = launched.stderr.splitlines()  # each state it passed, as it came
    assert states[0] in ("nb: pending", "nb: provisioning") and states[-1] == "nb: running"
    assert "running" in launched.stdout.splitlines()[1]

    ssh = ["ssh", "nb", "-i", str(laptop_key), "-o", "BatchMode=yes"]
    ran = gpucloud(*ssh, "--", "echo $((6*7)); exit 7")
    assert (ran.stdout, ran.returncode) == ("42\n", 7), ran.stderr
    known_hosts = tmp_path / "home" / ".config" / "gpucloud" / "known_hosts"
    host = Host.objects.get(name="gpu-1")
    (line,) = known_hosts.read_text().splitlines()
    assert line.startswith(f"[127.0.0.1]:{host.ssh_port} ssh-ed25519 ")
    shown = gpucloud("show", "nb")
    assert f"ssh host key: {host.ssh_host_key_fingerprint}" in shown.stdout

    # -o reaches ssh: it logs at the level asked
    verbose = gpucloud(*ssh, "-o", "LogLevel=DEBUG", "--", "true")
    assert verbose.returncode == 0 and "debug1:" in verbose.stderr
    # without -i there is no key to log in with (HOME is empty)
    keyless = gpucloud("ssh", "nb", "-o", "BatchMode=yes", "--", "true")
    assert keyless.returncode == 255 and "Permission denied" in keyless.stderr

    # The gateway presents another key than the one pinned and reported: ssh refuses loudly.
    impostor = asyncssh.generate_private_key("ssh-ed25519")
    pattern = f"[127.0.0.1]:{host.ssh_port}"
    known_hosts.write_text(f"{pattern} {impostor.export_public_key().decode()}")
    Host.objects.filter(pk=host.pk).update(
        ssh_host_key_fingerprint=impostor.get_fingerprint("sha256")
    )
    refused = gpucloud(*ssh, "--", "echo in")
    assert refused.returncode == 255 and "in\n" not in refused.stdout
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in refused.stderr
    # Nothing pinned, and the gateway's key is not the one the console reports: not even tried.
    known_hosts.unlink()
    refused = gpucloud(*ssh, "--", "echo in")
    assert refused.returncode == 1 and "not the host key the console reports" in refused.stderr
    assert not known_hosts.exists()
    # The console reports the gateway's key again: the stale pin is replaced, and said so.
    known_hosts.write_text(f"{pattern} {impostor.export_public_key().decode()}")
    Host.objects.filter(pk=host.pk).update(ssh_host_key_fingerprint=host.ssh_host_key_fingerprint)
    again = gpucloud(*ssh, "--", "echo in")
    assert (again.stdout, again.returncode) == ("in\n", 0), again.stderr
    assert f"host key of {pattern} changed to {host.ssh_host_key_fingerprint}" in again.stderr


def test_launch_wait_reports_a_failure_with_its_reason_and_exit_status(gpucloud, registry):
    # a registry the host reaches, which has no such image: the launch is taken, its pull fails
    ImageFactory(name="ghost", reference=f"{registry}/gpucloud/ghost:1", cuda_version="-")
    failed = gpucloud("launch", "ghost", "--spec", "a100-quarter", "--image", "ghost", "--wait")
    assert failed.returncode == 1, failed.stdout
    assert failed.stdout == ""
    last = failed.stderr.splitlines()[-1]  # the reason, in words where the API has them
    assert last.startswith("gpucloud: ghost is failed: ") and "image" in last, failed.stderr
