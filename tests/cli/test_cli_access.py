"""`gpucloud ssh-keys add/list/delete`, `gpucloud ssh ID [-- CMD]` (the system ssh, exec'd
with the instance's target) and `gpucloud launch --ssh-key/--port`, against a live console."""

import json

import asyncssh
import pytest

from cli import ssh as cli_ssh
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


def _running_on_a_gateway(pk: int, host_key) -> None:
    """The instance runs on gpu-1.example, whose gateway has `host_key`."""
    instance = Instance.objects.get(pk=pk)
    host = Host(name="gpu-1", region=instance.region, address="http://gpu-1.example:8101")
    host.set_secret("s")
    host.ssh_port, host.ssh_host_key_fingerprint = 2222, host_key.get_fingerprint("sha256")
    host.save()
    Allocation.objects.create(id="a1", instance=instance, host=host, mode="shared")
    Instance.objects.filter(pk=pk).update(state=State.RUNNING)


class Exec(Exception):
    """What the fake execvp raises: a real one never returns."""


@pytest.fixture
def execs(monkeypatch) -> list[list[str]]:
    """The ssh command lines that `gpucloud ssh` execs."""
    ran = []

    def execvp(file, argv):
        assert file == "ssh"
        ran.append(argv)
        raise Exec

    monkeypatch.setattr(cli_ssh.os, "execvp", execvp)
    return ran


def _key_line(key) -> str:
    return " ".join(key.export_public_key().decode().split()[:2])


def _scanned(monkeypatch, key) -> list:
    """The gateway (gpu-1.example, not reachable from here) presents `key` when scanned."""
    scanned = []
    monkeypatch.setattr(
        cli_ssh, "scan",
        lambda host, port: scanned.append((host, port)) or [tuple(_key_line(key).split())],
    )  # fmt: skip
    return scanned


def test_ssh_pins_the_host_key_and_execs_the_system_ssh(cli, monkeypatch, tmp_path, execs):  # noqa: F811
    code, out, _ = cli(
        "--json", "launch", "nb", "--spec", "a100-quarter", "--image", "pytorch-2.5-cuda12.4"
    )
    pk = json.loads(out)["id"]
    code, _, err = cli("ssh", str(pk))
    assert code == 1 and "is pending: ssh needs it running" in err
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    _running_on_a_gateway(pk, host_key)
    scanned = _scanned(monkeypatch, host_key)
    known_hosts = tmp_path / "known_hosts"  # next to GPUCLOUD_CONFIG
    pinned = ["-o", f"UserKnownHostsFile={known_hosts}", "-o", "StrictHostKeyChecking=yes"]
    with pytest.raises(Exec):
        cli("ssh", str(pk), "--", "nvidia-smi", "-L")
    with pytest.raises(Exec):
        cli("ssh", "nb", "-i", "~/k", "-o", "ServerAliveInterval=30", "-o", "LogLevel=ERROR")
    assert execs == [
        ["ssh", "-p", "2222", *pinned, f"{pk}@gpu-1.example", "nvidia-smi", "-L"],
        ["ssh", "-p", "2222", "-i", "~/k", "-o", "ServerAliveInterval=30", "-o", "LogLevel=ERROR",
         *pinned, f"{pk}@gpu-1.example"],
    ]  # fmt: skip
    assert known_hosts.read_text() == f"[gpu-1.example]:2222 {_key_line(host_key)}\n"
    assert scanned == [("gpu-1.example", 2222)]  # pinned once, then taken from the file
    code, out, _ = cli("show", "nb")
    assert f"ssh host key: {host_key.get_fingerprint('sha256')}" in out


def test_ssh_refuses_a_gateway_whose_key_the_console_does_not_report(
    cli, monkeypatch, tmp_path, execs  # noqa: F811
):  # fmt: skip
    code, out, _ = cli("--json", "launch", "nb", "--spec", "a100-quarter")
    reported = asyncssh.generate_private_key("ssh-ed25519")
    _running_on_a_gateway(json.loads(out)["id"], reported)
    intruder = asyncssh.generate_private_key("ssh-ed25519")
    _scanned(monkeypatch, intruder)
    code, _, err = cli("ssh", "nb", "--", "true")
    assert code == 1 and execs == []
    assert f"presents {intruder.get_fingerprint('sha256')}" in err
    assert f"not the host key the console reports ({reported.get_fingerprint('sha256')})" in err
    assert not (tmp_path / "known_hosts").exists()


def test_ssh_replaces_a_pinned_key_only_when_the_console_reports_the_new_one(
    cli, monkeypatch, tmp_path, capsys, execs  # noqa: F811
):  # fmt: skip
    code, out, _ = cli("--json", "launch", "nb", "--spec", "a100-quarter")
    old, new = (asyncssh.generate_private_key("ssh-ed25519") for _ in range(2))
    known_hosts = tmp_path / "known_hosts"
    other = f"[gpu-2.example]:2222 {_key_line(old)}"
    known_hosts.write_text(f"{other}\n[gpu-1.example]:2222 {_key_line(old)}\n")
    _running_on_a_gateway(json.loads(out)["id"], new)  # the host was re-keyed; the agent said so
    _scanned(monkeypatch, new)
    with pytest.raises(Exec):
        cli("ssh", "nb")
    assert len(execs) == 1
    err = capsys.readouterr().err
    assert f"host key of [gpu-1.example]:2222 changed to {new.get_fingerprint('sha256')}" in err
    assert known_hosts.read_text() == f"{other}\n[gpu-1.example]:2222 {_key_line(new)}\n"


def test_through_the_front_ssh_trusts_the_consoles_lines_on_both_hops(
    cli, monkeypatch, tmp_path, settings, execs  # noqa: F811
):  # fmt: skip
    settings.SSH_FRONT = "ssh.example:2200"
    settings.SSH_CA_KEY_FILE = str(tmp_path / "ca")
    settings.SSH_FRONT_HOST_KEY_FILE = str(tmp_path / "front")
    code, out, _ = cli("--json", "launch", "nb", "--spec", "a100-quarter")
    pk = json.loads(out)["id"]
    _running_on_a_gateway(pk, asyncssh.generate_private_key("ssh-ed25519"))
    monkeypatch.setattr(cli_ssh, "scan", lambda host, port: pytest.fail("nothing to scan"))
    known_hosts = tmp_path / "known_hosts"
    mine = "[elsewhere.example]:22 ssh-ed25519 AAAAkept"
    known_hosts.write_text(f"{mine}\n@cert-authority gpucloud ssh-ed25519 AAAAold-ca\n")
    with pytest.raises(Exec):
        cli("ssh", "nb", "-i", "~/my key", "--", "hostname")
    pinned = ["-o", f"UserKnownHostsFile={known_hosts}", "-o", "StrictHostKeyChecking=yes"]
    jump = (
        f"ssh -i '~/my key' -o UserKnownHostsFile={known_hosts} -o StrictHostKeyChecking=yes "
        f"-p 2200 -l {pk} -W %h:%p ssh.example"
    )
    assert execs == [["ssh", "-p", "22", "-i", "~/my key", "-o", f"ProxyCommand={jump}",
                      *pinned, f"{pk}@gpucloud", "hostname"]]  # fmt: skip
    # the lines are the console's, the old CA line replaced
    lines = known_hosts.read_text().splitlines()
    assert lines[0] == mine and lines[1].startswith("[ssh.example]:2200 ssh-ed25519 ")
    assert lines[2].startswith("@cert-authority gpucloud ssh-ed25519 ") and len(lines) == 3
    code, out, _ = cli("show", "nb")
    assert f"ssh: ssh -J {pk}@ssh.example:2200 {pk}@gpucloud" in out
    assert f"ssh host key: {cli_ssh.key_fingerprint(lines[1].split()[2])}" in out
    assert f"ssh known_hosts: {lines[2]}" in out
