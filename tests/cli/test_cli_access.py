"""`gpucloud ssh-keys add/list/delete`, `gpucloud ssh ID [-- CMD]` (the system ssh, exec'd
with the instance's target) and `gpucloud launch --ssh-key/--port`, against a live console."""

import json

import asyncssh
import pytest

from cli import main as cli_main
from console.fleet.models import Host
from console.instances.models import Allocation, Instance, State
from tests.cli.test_cli import cli  # noqa: F401 - the fixture

pytestmark = pytest.mark.django_db(transaction=True)


def test_keys_are_added_from_a_file_listed_and_deleted(cli, tmp_path):  # noqa: F811
    pub = tmp_path / "id_ed25519.pub"
    pub.write_text(asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode())
    code, out, _ = cli("--json", "ssh-keys", "add", "laptop", str(pub))
    assert code == 0
    fingerprint = json.loads(out)["fingerprint"]
    code, out, _ = cli("ssh-keys", "list")
    assert "laptop" in out and fingerprint in out
    code, _, err = cli("ssh-keys", "add", "laptop", str(pub))
    assert code == 1 and "already have a key named laptop" in err
    private = tmp_path / "id_ed25519"
    private.write_text(asyncssh.generate_private_key("ssh-ed25519").export_private_key().decode())
    code, _, err = cli("ssh-keys", "add", "oops", str(private))
    assert code == 1 and "private key" in err
    code, _, err = cli("ssh-keys", "add", "x", str(tmp_path / "missing.pub"))
    assert code == 1 and "cannot read" in err
    assert cli("ssh-keys", "delete", "laptop")[0] == 0
    assert cli("ssh-keys", "list")[1].strip() == "(none)"


def test_launch_with_keys_and_ports(cli, tmp_path):  # noqa: F811
    pub = tmp_path / "k.pub"
    pub.write_text(asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode())
    cli("ssh-keys", "add", "laptop", str(pub))
    code, out, _ = cli(
        "--json", "launch", "nb", "--spec", "a100-quarter", "--image", "pytorch-2.5-cuda12.4",
        "--ssh-key", "laptop", "--port", "8080:app",
    )  # fmt: skip
    assert code == 0, out
    instance = json.loads(out)
    assert instance["ssh_keys"] == ["laptop"]
    assert [(p["port"], p["name"]) for p in instance["ports"]] == [(8080, "app")]
    code, _, err = cli("launch", "x", "--spec", "a100-quarter", "--image", "pytorch-2.5-cuda12.4",
                       "--port", "8080")  # fmt: skip
    assert code == 1 and "PORT:NAME" in err


def test_ssh_execs_the_system_ssh_with_the_instances_target(cli, monkeypatch):  # noqa: F811
    code, out, _ = cli(
        "--json", "launch", "nb", "--spec", "a100-quarter", "--image", "pytorch-2.5-cuda12.4"
    )
    pk = json.loads(out)["id"]
    code, _, err = cli("ssh", str(pk))
    assert code == 1 and "is pending: ssh needs it running" in err
    instance = Instance.objects.get(pk=pk)
    host = Host(name="gpu-1", region=instance.region, address="http://gpu-1.example:8101")
    host.set_secret("s")
    host.ssh_port, host.ssh_host_key_fingerprint = 2222, "SHA256:x"
    host.save()
    Allocation.objects.create(id="a1", instance=instance, host=host, mode="shared")
    Instance.objects.filter(pk=pk).update(state=State.RUNNING)
    ran = []
    monkeypatch.setattr(cli_main.os, "execvp", lambda file, argv: ran.append((file, argv)))
    cli("ssh", str(pk), "--", "nvidia-smi", "-L")
    cli("ssh", str(pk))
    assert ran == [
        ("ssh", ["ssh", "-p", "2222", f"{pk}@gpu-1.example", "nvidia-smi", "-L"]),
        ("ssh", ["ssh", "-p", "2222", f"{pk}@gpu-1.example"]),
    ]
