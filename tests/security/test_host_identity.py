"""Issue 41, "a host's identity cannot be taken over": with a host's secret (stolen), a tenant
posted a heartbeat as the host with the address of its own container; the console then sent
that host's control calls (snapshot credentials, the secret as a Bearer token) and its
instances' SSH to the tenant.

Now a heartbeat never moves a host (only the operator or a new join does), no host address may
lie in a network the agents make for containers or be another machine's loopback, and the
secret is rotated (old one valid a grace period) or revoked (at once) through the real agent,
which alone receives the new one."""

import ipaddress
import json
import os
import socket
import stat
import time
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from agent.errors import ApiError
from agent.identity import HostSecret
from agent.state import StateStore
from console import launcher
from console.audit.models import AuditEntry
from console.fleet import addresses, agent_client, identity, services
from console.fleet.models import Host, HostEvent
from tests.factories import GpuModelFactory, RegionFactory
from tests.fleet.conftest import agent_client_for, make_inventory, post_json, with_digest

CONTAINERS = "10.89.0.0/24"  # a tenant network's subnet, as Podman gives it
TENANT_CONTAINER = "http://10.89.0.5:9000"


def heartbeat(secret: str, host: Host, **body) -> int:
    body = {"host_id": host.pk, "inventory_digest": host.inventory_digest, **body}
    return post_json(agent_client_for(secret), "/agent/v1/heartbeat", body).status_code


def samples(secret: str, host: Host) -> int:
    body = {"host_id": host.pk, "samples": []}
    return post_json(agent_client_for(secret), "/agent/v1/samples", body).status_code


def events(secret: str, host: Host) -> int:
    body = {"host_id": host.pk, "events": []}
    return post_json(agent_client_for(secret), "/agent/v1/events", body).status_code


@pytest.fixture
def oci_host(region, a100):
    """A host joined through the agent API, whose agent reported its containers' network."""
    answer = register_at(region, "http://127.0.0.1:9101", hostname="oci-1").json()
    host, secret = Host.objects.get(pk=answer["host_id"]), answer["secret"]
    inventory = with_digest({**make_inventory("oci-1", 1), "container_networks": [CONTAINERS]})
    assert heartbeat(secret, host, inventory=inventory, inventory_digest=inventory["digest"]) == 200
    host.refresh_from_db()
    return host, secret


def register_at(region, address: str, remote_addr: str = "127.0.0.1", hostname="host-n"):
    _, raw = services.create_join_token(region)
    body = {
        "join_token": raw,
        "hostname": hostname,
        "address": address,
        "inventory": make_inventory(hostname, 1),
    }
    return post_json(Client(REMOTE_ADDR=remote_addr), "/agent/v1/register", body)


# --- the address -----------------------------------------------------------------------


@pytest.mark.django_db
def test_a_stolen_secret_cannot_move_the_host_to_a_tenants_container(oci_host):
    host, secret = oci_host
    for _ in range(3):  # the thief keeps heartbeating
        heartbeat(secret, host, address=TENANT_CONTAINER)
    host.refresh_from_db()
    assert host.address == "http://127.0.0.1:9101"  # the console keeps calling the real agent
    reports = HostEvent.objects.filter(host=host, message__contains="reports the address")
    assert reports.count() == 1  # the operator sees it once, not at every heartbeat
    assert TENANT_CONTAINER in reports.get().message
    assert host.reported_address == TENANT_CONTAINER
    # the real agent reporting its own address again clears it; a new one is reported again
    heartbeat(secret, host, address="http://127.0.0.1:9101")
    heartbeat(secret, host, address="http://10.0.0.7:9101")
    assert reports.count() == 2


@pytest.mark.django_db
@pytest.mark.parametrize("address", [TENANT_CONTAINER, "http://[fd00:89::5]:9000"])
def test_a_registration_inside_a_container_network_is_refused(oci_host, region, address):
    Host.objects.filter(pk=oci_host[0].pk).update(container_networks=[CONTAINERS, "fd00:89::/64"])
    response = register_at(region, address)
    assert response.status_code == 400, response.content
    answer = response.json()
    assert answer["code"] == "invalid_address"
    assert "a network of containers" in answer["errors"]["address"][0]
    assert not Host.objects.filter(name="host-n").exists()


@pytest.mark.django_db
def test_the_refused_ranges_of_the_setting_hold_whatever_the_allowed_ones_say(
    region, a100, settings
):
    import ipaddress

    settings.AGENT_REFUSED_NETWORKS = [ipaddress.ip_network("172.17.0.0/16")]
    assert register_at(region, "http://172.17.0.9:9101").status_code == 400
    # a private network of the operator's own hosts is fine: whole ranges are not refused
    assert register_at(region, "http://192.168.1.20:9101").status_code == 201


@pytest.mark.django_db
def test_a_loopback_address_is_only_for_an_agent_on_the_consoles_machine(region, a100):
    response = register_at(region, "http://127.0.0.1:9101", remote_addr="10.0.0.9")
    assert response.status_code == 400, response.content
    assert "loopback" in response.json()["errors"]["address"][0]
    response = register_at(region, "http://[::1]:9101", remote_addr="192.168.1.9")
    assert response.status_code == 400
    assert register_at(region, "http://127.0.0.1:9101", remote_addr="127.0.0.1").status_code == 201


@pytest.mark.django_db
def test_an_operator_changes_the_address_only_to_where_an_agent_may_be(
    oci_host, register, staff_client
):
    remote, _ = register("remote-1")
    Host.objects.filter(pk=remote.pk).update(address="http://10.0.3.7:9101")
    url = f"/fleet/hosts/{remote.pk}/address/"
    for refused in (TENANT_CONTAINER, "http://127.0.0.1:9101", "http://169.254.169.254/"):
        response = staff_client.post(url, {"address": refused})
        assert response.status_code == 400, refused
        assert response.context["address_form"].errors["address"], refused
    remote.refresh_from_db()
    assert remote.address == "http://10.0.3.7:9101"
    assert not AuditEntry.objects.filter(action="host.change_address").exists()

    response = staff_client.post(url, {"address": "http://10.0.3.8:9101/"})
    assert response.status_code == 302
    remote.refresh_from_db()
    assert remote.address == "http://10.0.3.8:9101"
    entry = AuditEntry.objects.get(action="host.change_address")
    assert entry.before == {"address": "http://10.0.3.7:9101"}
    assert entry.after == {"address": "http://10.0.3.8:9101"}
    assert remote.events.filter(message__contains="address changed by the operator").exists()


@pytest.mark.django_db
def test_the_admin_changes_the_address_through_the_same_rules(oci_host, register, staff_client):
    remote, _ = register("remote-1")
    Host.objects.filter(pk=remote.pk).update(address="http://10.0.3.7:9101")
    url = f"/admin/fleet/host/{remote.pk}/change/"
    inlines = {
        f"{prefix}-{field}": "0"
        for prefix in ("gpus", "events")
        for field in ("TOTAL_FORMS", "INITIAL_FORMS")
    }
    response = staff_client.post(url, {"address": TENANT_CONTAINER, **inlines})
    assert response.status_code == 200  # the form again, with the field's error
    assert "a network of containers" in str(response.context["adminform"].form.errors["address"])
    response = staff_client.post(url, {"address": "http://10.0.3.9:9101", **inlines})
    assert response.status_code == 302, response.context["errors"]
    remote.refresh_from_db()
    assert remote.address == "http://10.0.3.9:9101"
    assert AuditEntry.objects.filter(action="host.change_address").count() == 1


# --- the secret (the agent faked: the end-to-end test below runs the real one) ---------------


@pytest.fixture
def pushed(monkeypatch):
    """The secrets handed to agents: (host name, secret, grace)."""
    handed = []

    def put(host, secret, grace):
        handed.append((host.name, secret, grace))
        return {"rotated": True}

    monkeypatch.setattr(agent_client, "put_host_secret", put)
    return handed


@pytest.mark.django_db
def test_a_rotation_keeps_the_old_secret_for_the_grace_only(register, pushed, settings):
    settings.HOST_SECRET_GRACE_SECONDS = 60
    host, old = register()
    host = identity.rotate_secret(host)
    (_, new, grace) = pushed[0]
    assert grace == 60 and host.secret == new
    assert heartbeat(new, host) == 200 and heartbeat(old, host) == 200  # in flight
    Host.objects.filter(pk=host.pk).update(previous_secret_until=timezone.now())
    assert heartbeat(old, host) == 401 and samples(old, host) == 401
    assert heartbeat(new, host) == 200
    assert AuditEntry.objects.filter(action="host.rotate_secret").count() == 1


@pytest.mark.django_db
def test_a_revoke_cuts_the_old_secret_at_once(register, pushed):
    host, old = register()
    identity.rotate_secret(host, revoke=True)
    new = pushed[0][1]
    assert pushed[0][2] == 0
    assert (heartbeat(old, host), samples(old, host), events(old, host)) == (401, 401, 401)
    assert heartbeat(new, host) == 200
    assert AuditEntry.objects.filter(action="host.revoke_secret").count() == 1


@pytest.mark.django_db
def test_the_admin_revokes_a_secret(register, pushed, staff_client):
    host, old = register()
    body = {"action": "revoke_secret", "_selected_action": [host.pk]}
    assert staff_client.post("/admin/fleet/host/", body).status_code == 302
    assert pushed[0][2] == 0 and heartbeat(old, host) == 401
    assert host.events.filter(message__contains="revoked", actor_label="operator").exists()


@pytest.mark.django_db
def test_an_agent_that_did_not_answer_keeps_its_secret(register, monkeypatch, staff_client):
    host, old = register()

    def away(host, secret, grace):
        away.secret = secret
        raise agent_client.AgentUnavailable(host, "PUT /v1/identity/secret: ConnectError")

    monkeypatch.setattr(agent_client, "put_host_secret", away)
    response = staff_client.post(f"/fleet/hosts/{host.pk}/secret/revoke/", follow=True)
    said = [str(m) for m in response.context["messages"]]
    assert any("did not answer" in m and "old secret stays in use" in m for m in said), said
    assert heartbeat(old, host) == 200  # not locked out
    # the agent did get it (its answer was lost): its first call with it makes it the host's
    assert heartbeat(away.secret, host) == 200
    host.refresh_from_db()
    assert host.secret == away.secret and not host.pending_secret_hash
    assert host.events.filter(message__contains="secret revoke failed").exists()


@pytest.mark.django_db
def test_an_agent_that_refused_leaves_nothing_pending(register, monkeypatch):
    host, old = register()

    def refuse(host, secret, grace):
        refuse.secret = secret
        raise agent_client.AgentRejected(host, "PUT /v1/identity/secret: Not Found", 404)

    monkeypatch.setattr(agent_client, "put_host_secret", refuse)
    with pytest.raises(ValidationError, match="refused the new secret"):
        identity.rotate_secret(host)
    assert heartbeat(refuse.secret, host) == 401 and heartbeat(old, host) == 200


@pytest.mark.django_db
def test_a_rotation_after_a_lost_answer_hands_the_same_secret_again(register, monkeypatch):
    host, old = register()
    handed = []

    def lost(host, secret, grace):
        handed.append(secret)
        raise agent_client.AgentUnavailable(host, "PUT /v1/identity/secret: ReadTimeout")

    def holds_it(host, secret, grace):  # it took the first one: the current one is refused
        handed.append(secret)
        raise agent_client.AgentRejected(host, "PUT /v1/identity/secret: unauthorized", 401)

    monkeypatch.setattr(agent_client, "put_host_secret", lost)
    with pytest.raises(ValidationError, match="did not answer"):
        identity.rotate_secret(host, revoke=True)
    monkeypatch.setattr(agent_client, "put_host_secret", holds_it)
    with pytest.raises(ValidationError, match="holds the new one already"):
        identity.rotate_secret(host, revoke=True)
    assert handed[0] == handed[1]
    assert heartbeat(handed[0], host) == 200  # the agent is never locked out
    host.refresh_from_db()
    assert host.secret == handed[0]


@pytest.mark.django_db
def test_the_schedule_rotates_the_secrets_that_are_due(register, pushed, settings):
    settings.HOST_SECRET_ROTATION_DAYS = 30
    due, _ = register("old-1")
    fresh, _ = register("new-1")
    Host.objects.filter(pk=due.pk).update(secret_rotated_at=timezone.now() - timedelta(days=31))
    assert identity.due_for_rotation() == [due.pk]
    assert identity.rotate_scheduled(due.pk) and not identity.rotate_scheduled(fresh.pk)
    assert [name for name, _, _ in pushed] == ["old-1"]
    assert identity.due_for_rotation() == []
    settings.HOST_SECRET_ROTATION_DAYS = 0
    Host.objects.update(secret_rotated_at=timezone.now() - timedelta(days=400))
    assert identity.due_for_rotation() == []


# --- the agent's side -------------------------------------------------------------------

NEW = "n" * 43


def test_the_agent_keeps_a_new_secret_in_its_identity_file(tmp_path):
    store = StateStore(tmp_path / "state")
    store.save_identity({"server": "http://c", "host_id": 1, "secret": "o" * 43})
    secret = HostSecret.of_identity(store, store.load_identity())
    secret.rotate({"secret": NEW, "grace_seconds": 60})
    kept = store.root / "identity.json"
    assert stat.S_IMODE(os.stat(kept).st_mode) == 0o600
    assert json.loads(kept.read_text())["secret"] == NEW
    assert secret.current == NEW and secret.accepts(NEW) and secret.accepts("o" * 43)
    assert len(secret.data_keys()) == 2
    # a restart within the grace still takes the old one; a revoke ends its grace at once
    again = HostSecret.of_identity(store, store.load_identity())
    assert again.accepts("o" * 43)
    again.rotate({"secret": NEW, "grace_seconds": 0})
    assert not again.accepts("o" * 43) and again.accepts(NEW) and len(again.data_keys()) == 1


def test_the_old_secret_opens_nothing_on_the_agent_after_its_grace(tmp_path, monkeypatch):
    store = StateStore(tmp_path)
    secret = HostSecret("o" * 43, store, {"host_id": 1})
    secret.rotate({"secret": NEW, "grace_seconds": 5})
    later = time.time() + 6
    monkeypatch.setattr(time, "time", lambda: later)
    assert not secret.accepts("o" * 43) and secret.data_keys() == [secret.data_keys()[0]]


@pytest.mark.parametrize(
    "body",
    [
        {"secret": "short", "grace_seconds": 0},
        {"secret": NEW, "grace_seconds": -1},
        {"secret": NEW, "grace_seconds": True},
        {"secret": NEW + "\n", "grace_seconds": 0},
        {"secret": NEW},
        [NEW],
    ],
)
def test_the_agent_refuses_a_bad_secret_body(tmp_path, body):
    secret = HostSecret("o" * 43, StateStore(tmp_path), {})
    with pytest.raises(ApiError) as refused:
        secret.rotate(body)
    assert refused.value.status == 400 and secret.current == "o" * 43


def test_a_standalone_agent_keeps_its_secret():
    with pytest.raises(ApiError) as refused:
        HostSecret("o" * 43).rotate({"secret": NEW, "grace_seconds": 0})
    assert refused.value.status == 409


# --- through the real agent and console -------------------------------------------------


def wait_for(check, stack, what: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}\n{stack.logs()}")


def heard_since(host: Host, moment) -> bool:
    host.refresh_from_db()
    return host.last_heartbeat_at > moment


@pytest.mark.integration
def test_rotate_and_revoke_through_the_real_agent(stack, transactional_db, settings):
    _, raw = services.create_join_token(RegionFactory(code="local-1", name="Local 1"))
    GpuModelFactory()
    state_dir = stack.log_dir / "agent-id-1"
    stack.start_agent("id-1", region="local-1", gpus=1, mode="whole", join_token=raw)
    host = wait_for(lambda: Host.objects.filter(name="id-1").first(), stack, "registration")
    original = host.secret
    console = httpx.Client(base_url=stack.url)

    def answers() -> bool:
        try:
            return agent_client.list_allocations(host) == []
        except agent_client.AgentUnavailable:
            return False

    wait_for(answers, stack, "the agent's API")

    def thief(secret: str) -> tuple[int, int]:
        headers = {"Authorization": f"Bearer {secret}"}
        beat = console.post(
            "/agent/v1/heartbeat",
            json={"host_id": host.pk, "address": TENANT_CONTAINER},
            headers=headers,
        )
        batch = console.post(
            "/agent/v1/samples", json={"host_id": host.pk, "samples": []}, headers=headers
        )
        return beat.status_code, batch.status_code

    def agent_takes(secret: str) -> int:
        response = httpx.get(
            f"{host.address}/v1/allocations", headers={"Authorization": f"Bearer {secret}"}
        )
        return response.status_code

    # a rotation: the agent takes the new secret, keeps working, the old one lasts the grace
    settings.HOST_SECRET_GRACE_SECONDS = 2
    rotated_at = timezone.now()
    host = identity.rotate_secret(host)
    rotated = host.secret
    kept = Path(state_dir) / "identity.json"
    assert json.loads(kept.read_text())["secret"] == rotated
    assert stat.S_IMODE(os.stat(kept).st_mode) == 0o600
    assert answers()  # control calls with the new secret
    wait_for(lambda: heard_since(host, rotated_at), stack, "a heartbeat with the new secret")
    assert thief(original)[0] == 200 and agent_takes(original) == 200  # the grace
    wait_for(lambda: thief(original) == (401, 401), stack, "the grace's end", timeout=5)
    assert agent_takes(original) == 401

    # a revoke: the thief holding the secret in use is cut at once, the agent goes on
    assert thief(rotated)[0] == 200
    host = identity.rotate_secret(host, revoke=True)
    revoked_at = timezone.now()
    assert thief(rotated) == (401, 401) and agent_takes(rotated) == 401
    assert answers()
    wait_for(lambda: heard_since(host, revoked_at), stack, "a heartbeat after the revoke")
    host.refresh_from_db()
    assert host.address.startswith("http://127.0.0.1:")  # the thief's heartbeats moved nothing
    assert json.loads(kept.read_text())["secret"] == host.secret


@pytest.mark.django_db
def test_the_management_command_changes_an_address_by_the_same_rules(oci_host):
    host, _ = oci_host
    with pytest.raises(CommandError, match="a network of containers"):
        call_command("set_host_address", "oci-1", TENANT_CONTAINER)
    call_command("set_host_address", "oci-1", "http://127.0.0.1:9102")
    host.refresh_from_db()
    assert host.address == "http://127.0.0.1:9102"


def test_make_run_keeps_a_demo_agents_port_and_says_when_it_must_change(tmp_path, monkeypatch):
    told = []
    monkeypatch.setattr(launcher, "manage", lambda *args, env: told.append(args))
    first = launcher._agent_port("host-a", tmp_path, False, {})
    assert launcher._agent_port("host-a", tmp_path, True, {}) == first and told == []
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", first))
        taken.listen()
        moved = launcher._agent_port("host-a", tmp_path, True, {})
    assert moved != first
    assert told == [("set_host_address", "host-a", f"http://127.0.0.1:{moved}")]


@pytest.mark.parametrize(
    "address",
    [
        "http://[64:ff9b::a9fe:a9fe]:9101",  # NAT64 of 169.254.169.254, the metadata service
        "http://[::ffff:169.254.169.254]:9101",
        "http://[2002:a9fe:a9fe::1]:9101",  # 6to4 of the metadata service
    ],
)
@pytest.mark.django_db
def test_an_ipv6_form_of_a_refused_ipv4_address_is_refused(settings, address):
    everywhere = [ipaddress.ip_network("::/0"), ipaddress.ip_network("0.0.0.0/0")]
    settings.AGENT_ALLOWED_NETWORKS = everywhere
    assert "link-local" in addresses.address_problem(address, local=True)
