"""What operators do: host status, GPU modes, join tokens; the fleet page, the admin and the
management command that do it."""

import html
import re
from io import StringIO

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from accounts.roles import Role
from console.fleet import agent_client, services
from console.fleet.models import Gpu, Host, HostEvent, JoinToken
from tests.factories import MembershipFactory, TenantFactory, UserFactory

pytestmark = pytest.mark.django_db


# --- services -------------------------------------------------------------------------


def test_status_transitions_and_events(register):
    host, _ = register()
    operator = UserFactory(username="ops", is_staff=True)
    for status in ("cordoned", "active", "draining", "maintenance", "active"):
        host = services.set_host_status(host, status, actor=operator)
        assert host.status == host.admin_status == status
    assert [e.to_status for e in HostEvent.objects.filter(host=host, actor=operator)] == [
        "active", "maintenance", "draining", "active", "cordoned"
    ]  # fmt: skip
    with pytest.raises(ValidationError, match="An operator can set"):
        services.set_host_status(host, "unreachable")
    host = services.set_host_status(host, "retired", actor=operator)
    with pytest.raises(ValidationError, match="retired; it cannot become active"):
        services.set_host_status(host, "active")
    assert not host.schedulable


def test_retire_refused_while_slices_are_held(register, claim):
    host, _ = register()
    held = claim(host.gpus.get(index=0))
    with pytest.raises(ValidationError, match="still holds 1 GPU slice"):
        services.set_host_status(host, "retired")
    held.delete()
    assert services.set_host_status(host, "retired").status == "retired"


def test_gpu_mode_change_refused_while_allocated(register, claim, monkeypatch):
    host, _ = register()
    gpu = host.gpus.get(index=0)
    claim(gpu, slot=0)
    called = []
    monkeypatch.setattr(agent_client, "set_gpu_mode", lambda *a: called.append(a) or {})
    with pytest.raises(ValidationError, match="1 slice\\(s\\) allocated"):
        services.set_gpu_mode(gpu, "whole")
    assert called == []  # the agent was not even asked
    gpu.refresh_from_db()
    assert gpu.mode == "mig"


def test_gpu_mode_change_asks_the_agent_then_follows(register, monkeypatch):
    host, _ = register()
    gpu = host.gpus.get(index=2)
    calls = []

    def fake(h, index, mode):
        calls.append((h.name, index, mode))
        return {"index": index, "mode": mode, "mig_enabled": False}

    monkeypatch.setattr(agent_client, "set_gpu_mode", fake)
    gpu = services.set_gpu_mode(gpu, "shared")
    assert calls == [("host-x", 2, "shared")]
    assert (gpu.mode, gpu.mig_enabled) == ("shared", False)
    assert Host.objects.get(pk=host.pk).inventory_digest == ""
    with pytest.raises(ValidationError, match="Unknown mode"):
        services.set_gpu_mode(gpu, "quantum")


def test_gpu_mode_change_reports_an_agent_that_cannot(register, monkeypatch):
    host, _ = register()
    gpu = host.gpus.get(index=0)

    def refuses(h, index, mode):
        raise agent_client.AgentRejected(h, "PUT /v1/gpus/0/mode: Not Found", 404)

    monkeypatch.setattr(agent_client, "set_gpu_mode", refuses)
    with pytest.raises(ValidationError, match="cannot change GPU modes"):
        services.set_gpu_mode(gpu, "whole")

    def down(h, index, mode):
        raise agent_client.AgentUnavailable(h, "ConnectError")

    monkeypatch.setattr(agent_client, "set_gpu_mode", down)
    with pytest.raises(ValidationError, match="did not answer"):
        services.set_gpu_mode(gpu, "whole")
    gpu.refresh_from_db()
    assert gpu.mode == "mig"


def test_mig_needs_a_mig_capable_model(register, monkeypatch):
    host, _ = register(mode="whole")
    gpu = host.gpus.get(index=0)
    gpu.model.mig_capable = False
    gpu.model.save()
    monkeypatch.setattr(agent_client, "set_gpu_mode", lambda *a: {})
    with pytest.raises(ValidationError, match="does not support MIG"):
        services.set_gpu_mode(gpu, "mig")


def test_join_token_is_hashed_and_expires(region, settings):
    settings.JOIN_TOKEN_TTL_HOURS = 2
    token, raw = services.create_join_token("local-1", note=" rack 4 ")
    assert raw.startswith(token.prefix + "_") and token.token_hash == JoinToken.hash(raw)
    assert raw not in str(JoinToken.objects.filter(pk=token.pk).values().get())
    assert round((token.expires_at - token.created_at).total_seconds()) == 7200
    assert token.note == "rack 4" and token.state == "unused"
    with pytest.raises(ValidationError, match="Unknown region 'mars-1'"):
        services.create_join_token("mars-1")
    with pytest.raises(ValidationError):
        services.create_join_token(region, ttl_hours=0)


# --- the fleet page -------------------------------------------------------------------


@pytest.mark.parametrize("role", [Role.VIEWER, Role.OWNER])
def test_fleet_page_is_404_for_tenant_users(register, role):
    host, _ = register()
    membership = MembershipFactory(tenant=TenantFactory(slug="acme"), role=role)
    client = Client()
    client.force_login(membership.user)
    gpu = host.gpus.first()
    assert client.get("/fleet/").status_code == 404
    assert client.get(f"/fleet/hosts/{host.pk}/").status_code == 404
    assert client.post(f"/fleet/hosts/{host.pk}/status/", {"status": "retired"}).status_code == 404
    assert client.post(f"/fleet/gpus/{gpu.pk}/mode/", {"mode": "whole"}).status_code == 404
    assert client.post("/fleet/join-tokens/", {"region": host.region_id}).status_code == 404
    host.refresh_from_db()
    assert host.status == "active" and JoinToken.objects.filter(used_at=None).count() == 0


def test_fleet_page_sends_strangers_to_login():
    response = Client().get("/fleet/")
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_fleet_page_shows_hosts_gpus_and_slices(register, claim, staff_client):
    host, _ = register("host-a", gpus=2)
    register("host-b", gpus=2, mode="shared", model="a100-80gb")
    claim(host.gpus.get(index=0), slot=0)
    claim(host.gpus.get(index=0), slot=4)
    shared = Gpu.objects.get(host__name="host-b", index=1)
    claim(shared, slot=None, milli=250)
    claim(shared, slot=None, milli=500)
    with CaptureQueriesContext(connection) as queries:
        response = staff_client.get("/fleet/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "host-a" in page and "host-b" in page
    assert "2/8 slices" in page and "750/1000 milli" in page
    assert "NVIDIA A100 80GB" in page and "badge-active" in page
    many = len(queries)
    for n in range(3):
        register(f"host-more-{n}", gpus=4)
    with CaptureQueriesContext(connection) as queries:
        assert staff_client.get("/fleet/").status_code == 200
    assert len(queries) == many  # no query per host or GPU
    detail = staff_client.get(f"/fleet/hosts/{host.pk}/")
    assert detail.status_code == 200 and "registered with join token" in detail.content.decode()


def test_fleet_page_buttons_change_status(register, staff_client):
    host, _ = register()
    response = staff_client.post(
        f"/fleet/hosts/{host.pk}/status/", {"status": "draining"}, follow=True
    )
    assert response.status_code == 200
    assert "host-x is now draining" in response.content.decode()
    host.refresh_from_db()
    assert host.status == "draining"
    assert HostEvent.objects.filter(host=host, actor_label="operator").exists()
    page = f"/fleet/hosts/{host.pk}/"
    back = staff_client.post(f"{page}status/", {"status": "cordoned", "next": page})
    assert back["Location"] == page
    away = staff_client.post(f"{page}status/", {"status": "active", "next": "//evil.example/"})
    assert away["Location"] == "/fleet/"
    staff_client.post(f"/fleet/hosts/{host.pk}/status/", {"status": "retired"})
    response = staff_client.post(
        f"/fleet/hosts/{host.pk}/status/", {"status": "active"}, follow=True
    )
    assert "cannot become active" in response.content.decode()


def test_fleet_page_mode_change_refused_while_allocated(register, claim, staff_client):
    host, _ = register()
    gpu = host.gpus.get(index=1)
    claim(gpu, slot=2)
    response = staff_client.post(f"/fleet/gpus/{gpu.pk}/mode/", {"mode": "whole"}, follow=True)
    assert response.status_code == 200
    assert "its mode can change only when nothing is allocated on it" in response.content.decode()
    gpu.refresh_from_db()
    assert gpu.mode == "mig"


def test_fleet_page_creates_a_join_token_shown_once(region, staff_client):
    response = staff_client.post(
        "/fleet/join-tokens/", {"region": region.pk, "note": "rack 9", "ttl_hours": 3}
    )
    assert response.status_code == 200
    page = response.content.decode()
    raw = re.search(r'id="new-join-token-value">([^<]+)<', page).group(1)
    token = JoinToken.objects.get()
    assert token.token_hash == JoinToken.hash(raw) and token.note == "rack 9"
    assert token.created_by.username == "operator"
    command = html.unescape(re.search(r'data-testid="join-command">([^<]+)</pre>', page).group(1))
    assert command == (  # a real host's, by default
        "gpucloud-agent --server http://testserver \\\n"
        f"  --join-token {raw} \\\n"
        "  --region local-1 --backend nvml \\\n"
        "  --runtime oci --state-dir /var/lib/gpucloud-agent \\\n"
        "  --listen 0.0.0.0:9101 --advertise-url http://gpu-host-1:9101 \\\n"
        "  --ssh-listen 0.0.0.0:2222"
    )
    assert raw not in staff_client.get("/fleet/").content.decode()
    bad = staff_client.post("/fleet/join-tokens/", {"region": 999999})
    assert bad.status_code == 400 and JoinToken.objects.count() == 1
    staff_client.post(f"/fleet/join-tokens/{token.pk}/revoke/")
    token.refresh_from_db()
    assert token.state == "expired"


def test_drain_and_maintenance_are_confirmed_with_a_note_for_the_tenants(register, staff_client):
    host, _ = register("host-a")
    fleet = staff_client.get("/fleet/").content.decode()
    link = re.search(r'href="(/fleet/hosts/\d+/status/\?status=maintenance[^"]*)"', fleet)
    page = staff_client.get(html.unescape(link.group(1)))
    assert page.status_code == 200 and "Maintenance for host-a?" in page.content.decode()
    assert Host.objects.get(pk=host.pk).status == "active"  # asking changes nothing
    response = staff_client.post(
        f"/fleet/hosts/{host.pk}/status/",
        {"status": "maintenance", "note": "PSU swap, back at 18:00", "next": "/fleet/"},
    )
    assert response.status_code == 302 and response.url == "/fleet/"
    host.refresh_from_db()
    assert (host.status, host.operator_note) == ("maintenance", "PSU swap, back at 18:00")
    assert host.events.first().message == "operator set maintenance: PSU swap, back at 18:00"
    staff_client.post(f"/fleet/hosts/{host.pk}/status/", {"status": "active"})
    host.refresh_from_db()
    assert (host.status, host.operator_note) == ("active", "")
    drain = staff_client.get(f"/fleet/hosts/{host.pk}/status/?status=draining&next=//evil")
    assert "Drain host-a?" in drain.content.decode() and "//evil" not in drain.content.decode()


# --- the admin ------------------------------------------------------------------------


def test_admin_actions(register, staff_client, claim):
    a, _ = register("host-a")
    b, _ = register("host-b")
    url = "/admin/fleet/host/"
    steps = [
        ("set_cordoned", "cordoned"),
        ("set_active", "active"),
        ("set_draining", "draining"),
        ("set_maintenance", "maintenance"),
    ]
    for action, status in steps:
        chosen = {"action": action, "_selected_action": [a.pk, b.pk]}
        if status in Host.ANNOUNCED:  # a confirmation page first, with the note for tenants
            asked = staff_client.post(url, chosen)
            assert asked.status_code == 200 and 'name="note"' in asked.content.decode()
            assert status not in set(Host.objects.values_list("status", flat=True))
            chosen |= {"confirmed": "yes", "note": f"{status} till noon"}
        response = staff_client.post(url, chosen)
        assert response.status_code == 302
        assert set(Host.objects.values_list("status", flat=True)) == {status}
        if status in Host.ANNOUNCED:
            assert Host.objects.get(pk=a.pk).operator_note == f"{status} till noon"
    claim(b.gpus.first())
    response = staff_client.post(
        url, {"action": "set_retired", "_selected_action": [a.pk, b.pk]}, follow=True
    )
    page = response.content.decode()
    assert "still holds 1 GPU slice" in page
    assert Host.objects.get(pk=a.pk).status == "retired"
    assert Host.objects.get(pk=b.pk).status == "maintenance"
    pages = [
        url,
        f"{url}{a.pk}/change/",
        f"{url}?q=host-a",
        "/admin/fleet/gpu/",
        "/admin/fleet/gpu/?healthy__exact=0",
        "/admin/fleet/jointoken/",
        "/admin/fleet/jointoken/add/",
        "/admin/fleet/hostevent/",
    ]
    for path in pages:
        assert staff_client.get(path).status_code == 200, path


def test_admin_gpu_mode_action_refuses_allocated(register, staff_client, claim):
    host, _ = register()
    gpu = host.gpus.get(index=0)
    claim(gpu)
    response = staff_client.post(
        "/admin/fleet/gpu/",
        {"action": "set_mode_whole", "_selected_action": [gpu.pk]},
        follow=True,
    )
    assert "allocated" in response.content.decode()
    gpu.refresh_from_db()
    assert gpu.mode == "mig"


def test_admin_creates_join_token_and_shows_it_once(region, staff_client):
    response = staff_client.post(
        "/admin/fleet/jointoken/add/",
        {"region": region.pk, "note": "from admin", "ttl_hours": 5},
        follow=True,
    )
    assert response.status_code == 200
    page = response.content.decode()
    raw = re.search(r"<code class='join-token'>([^<]+)</code>", page).group(1)
    token = JoinToken.objects.get()
    assert token.token_hash == JoinToken.hash(raw) and token.note == "from admin"
    assert round((token.expires_at - token.created_at).total_seconds()) == 5 * 3600
    assert (
        raw not in staff_client.get(f"/admin/fleet/jointoken/{token.pk}/change/").content.decode()
    )


# --- the management command -----------------------------------------------------------


def test_create_join_token_command(region):
    out = StringIO()
    call_command(
        "create_join_token", "--region", "local-1", "--note", "n1", "--ttl-hours", "1", stdout=out
    )
    raw = out.getvalue().strip().splitlines()[-1]
    token = JoinToken.objects.get()
    assert token.token_hash == JoinToken.hash(raw) and token.note == "n1"
    with pytest.raises(CommandError, match="Unknown region 'nowhere'"):
        call_command("create_join_token", "--region", "nowhere", stdout=StringIO())
