"""With an SSH front, every host's gateway gets a host certificate of the console's CA (for the
name `gpucloud`): on registration, when its key changes, and before it expires; what an agent
reports of its key and certificate is believed only as far as it checks out."""

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import asyncssh
import pytest
from django.utils import timezone

from console.fleet import agent_client, services, ssh_authority
from console.fleet.models import Host
from tests.fleet.conftest import agent_client_for, make_inventory, post_json, with_digest
from tests.metrics.test_prometheus import families, scrape

GATEWAY_KEY = asyncssh.generate_private_key("ssh-ed25519")
FINGERPRINT = GATEWAY_KEY.get_fingerprint("sha256")
PUBLIC = GATEWAY_KEY.export_public_key().decode().strip()


@pytest.fixture
def front(settings, tmp_path):
    settings.SSH_FRONT = "ssh.example:2200"
    settings.SSH_CA_KEY_FILE = str(tmp_path / "ca")
    settings.SSH_FRONT_HOST_KEY_FILE = str(tmp_path / "front")


@pytest.fixture
def queued(monkeypatch):
    """The certify tasks services queue, by host."""
    sent = []
    monkeypatch.setattr(
        services, "enqueue_on_commit", lambda name, *args, **_: sent.append((name, *args))
    )
    return sent


@pytest.fixture
def pushed(monkeypatch):
    """The certificates handed to agents, by host name."""
    given = []
    monkeypatch.setattr(
        agent_client, "put_host_certificate", lambda host, cert: given.append((host.name, cert))
    )
    return given


def _heartbeat(host, secret, ssh) -> Host:
    inventory = with_digest({**make_inventory(host.name), "ssh": ssh})
    body = {"host_id": host.pk, "inventory_digest": inventory["digest"], "inventory": inventory}
    assert post_json(agent_client_for(secret), "/agent/v1/heartbeat", body).status_code == 200
    host.refresh_from_db()
    return host


def test_a_gateway_that_reports_its_key_is_certified_once_and_trusted_after(
    front, register, queued, pushed
):
    host, secret = register()
    assert queued == []  # its inventory had no gateway
    ssh = {"port": 2222, "host_key_fingerprint": FINGERPRINT, "host_key": PUBLIC}
    host = _heartbeat(host, secret, ssh)
    assert host.ssh_host_key == " ".join(PUBLIC.split()[:2])
    assert queued == [("console.fleet.tasks.certify_gateway", host.pk)]

    assert services.certify_gateway(host.pk)
    [(name, text)] = pushed
    certificate = asyncssh.import_certificate(text)
    certificate.validate(asyncssh.public_key.CERT_TYPE_HOST, "gpucloud")
    assert certificate.principals == ["gpucloud"]
    assert certificate.key.public_data == GATEWAY_KEY.public_data
    assert certificate.signing_key.public_data == ssh_authority.authority().public_data
    host.refresh_from_db()
    expires = host.ssh_certificate_expires_at
    assert timedelta(days=89) < expires - timezone.now() <= timedelta(days=90)
    assert not services.certify_gateway(host.pk)  # nothing due: nothing signed again
    assert len(pushed) == 1

    # the agent reports the certificate with its next inventory: nothing more is queued
    reported = {"authority": ssh_authority.fingerprint(ssh_authority.authority()),
                "valid_before": int(expires.timestamp())}  # fmt: skip
    host = _heartbeat(host, secret, {**ssh, "certificate": reported})
    assert host.ssh_certificate_expires_at == expires.replace(microsecond=0)
    assert len(queued) == 1


def test_what_does_not_check_out_is_not_believed(front, register, queued):
    host, secret = register()
    other_ca = asyncssh.generate_private_key("ssh-ed25519")
    other_key = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode()
    for ssh in (
        {"port": 2222, "host_key_fingerprint": FINGERPRINT, "host_key": other_key},
        {"port": 2222, "host_key_fingerprint": FINGERPRINT, "host_key": "ssh-ed25519 garbage"},
    ):
        assert _heartbeat(host, secret, ssh).ssh_host_key == ""
    foreign = {"authority": other_ca.get_fingerprint("sha256"), "valid_before": 2**40}
    ssh = {"port": 2222, "host_key_fingerprint": FINGERPRINT, "host_key": PUBLIC}
    host = _heartbeat(host, secret, {**ssh, "certificate": foreign})
    assert host.ssh_certificate_expires_at is None  # another CA's: the gateway needs ours
    assert queued == [("console.fleet.tasks.certify_gateway", host.pk)]
    huge = {**ssh, "certificate": {"authority": foreign["authority"], "valid_before": 2**70}}
    inventory = with_digest({**make_inventory(host.name), "ssh": huge})
    body = {"host_id": host.pk, "inventory_digest": inventory["digest"], "inventory": inventory}
    assert post_json(agent_client_for(secret), "/agent/v1/heartbeat", body).status_code == 400


def test_certificates_that_expire_soon_are_renewed_and_none_without_a_front(
    front, register, queued, pushed, settings
):
    soon, later = register("host-a")[0], register("host-b")[0]
    now = timezone.now()
    for host, expires in ((soon, now + timedelta(days=10)), (later, now + timedelta(days=60))):
        Host.objects.filter(pk=host.pk).update(
            ssh_port=2222,
            ssh_host_key=" ".join(PUBLIC.split()[:2]),
            ssh_certificate_expires_at=expires,
        )
    assert services.certify_due_gateways() == [soon.pk]
    assert services.certify_gateway(soon.pk) and [name for name, _ in pushed] == ["host-a"]
    settings.SSH_FRONT = ""
    Host.objects.filter(pk=later.pk).update(ssh_certificate_expires_at=None)
    assert services.certify_due_gateways() == []
    assert not services.certify_gateway(later.pk)


def test_processes_that_make_the_ca_key_at_once_all_read_the_same_whole_key(front, tmp_path):
    """The first console processes start together (two agents joining at once): each may make
    the key, none reads one half written (the race that left a host uncertified for an hour)."""
    path = str(tmp_path / "ca-raced")
    start = threading.Barrier(8)

    def make():
        start.wait()
        return ssh_authority._key.__wrapped__(path)

    with ThreadPoolExecutor(8) as pool:
        keys = list(pool.map(lambda _: make(), range(8)))
    assert {ssh_authority.fingerprint(key) for key in keys} == {
        ssh_authority.fingerprint(asyncssh.read_private_key(path))
    }
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".ca-raced")] == []
    assert (tmp_path / "ca-raced").stat().st_mode & 0o777 == 0o600


def test_a_gateway_without_a_valid_certificate_is_flagged_on_the_fleet_page_and_in_metrics(
    front, register, queued, pushed, staff_client
):
    host, secret = register()
    host = _heartbeat(
        host, secret, {"port": 2222, "host_key_fingerprint": FINGERPRINT, "host_key": PUBLIC}
    )
    assert host.gateway_uncertified
    page = staff_client.get("/fleet/").content.decode()
    assert "SSH gateway not certified" in page
    assert scraped_certified(host.name) == 0

    services.certify_gateway(host.pk)
    host.refresh_from_db()
    assert not host.gateway_uncertified
    assert "SSH gateway not certified" not in staff_client.get("/fleet/").content.decode()
    assert scraped_certified(host.name) == 1

    Host.objects.filter(pk=host.pk).update(
        ssh_certificate_expires_at=timezone.now() - timedelta(seconds=1)
    )
    host.refresh_from_db()
    assert host.gateway_uncertified and scraped_certified(host.name) == 0


def scraped_certified(name: str) -> float:
    [sample] = [
        s
        for s in families(scrape()[1])["gpucloud_host_ssh_gateway_certified"]
        if s.labels["host"] == name
    ]
    return sample.value
