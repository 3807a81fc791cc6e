"""A tenant's registry credential is write-only: after it is given, its token is in no API
answer, page, instance event, audit entry or console log line (a launch that pulls with it
included), not in the allocation the console stores, and not in the agent's state directory.
Only the agent's request for that pull carries it. Hostile input is refused field by field,
and a refused request's audit entry masks the password."""

import json
import logging

import pytest

from accounts.roles import Role
from agent.allocations import Allocation as AgentAllocation
from agent.allocations import parse_registry_auth
from agent.state import StateStore
from console.audit.models import AuditEntry
from console.catalog.models import Mode
from console.instances import tasks
from console.instances.models import Allocation, Instance, InstanceEvent
from console.registry_credentials.models import RegistryCredential
from tests.clients import signed_in
from tests.instances.fakes import FakeAgents

PASSWORD = "rEgPw-7f3c9a1d-DISTINCTIVE"
URL = "/api/v1/registry-credentials/"
REF = "registry.example.com/team/trainer:1.0"


@pytest.fixture
def admin(tenant, make_member):
    return make_member(tenant, Role.ADMIN, username="ada")


@pytest.fixture
def agents(monkeypatch):
    return FakeAgents().install(monkeypatch)


def _clear(text: str) -> None:
    assert PASSWORD not in text


@pytest.fixture
def launched(
    catalog, admin, member, token_client, agents, caplog, django_capture_on_commit_callbacks
):
    """A credential saved by an admin, then an instance of that registry launched by a
    member and provisioned by its task against the fake agent, every log line captured."""
    caplog.set_level(logging.DEBUG)
    catalog.host(gpus=1, mode=Mode.SHARED)
    body = {"registry": "registry.example.com", "username": "ci-bot", "password": PASSWORD}
    saved = token_client(admin).post(URL, body, format="json")
    assert saved.status_code == 201
    _clear(saved.content.decode())
    launch = {"name": "own", "spec": "a100-quarter", "image_ref": REF}
    with django_capture_on_commit_callbacks(execute=False):
        response = token_client(member).post("/api/v1/instances/", launch, format="json")
    assert response.status_code == 202, response.json()
    _clear(response.content.decode())
    tasks.provision.apply(args=[response.json()["id"]])
    return Instance.objects.get(pk=response.json()["id"])


def test_only_the_agents_request_carries_it(launched, agents, caplog):
    (sent,) = [a["body"] for allocations in agents.hosts.values() for a in allocations.values()]
    assert sent["registry_auth"]["password"] == PASSWORD
    _clear(json.dumps(list(Allocation.objects.values("request"))))
    _clear(json.dumps(list(Instance.objects.values()), default=str))
    _clear(json.dumps(list(InstanceEvent.objects.values("message"))))
    _clear(json.dumps(list(AuditEntry.objects.values()), default=str))
    _clear(caplog.text)
    assert RegistryCredential.objects.get().last_used_at is not None


def test_no_api_answer_or_page_shows_it(launched, admin, token_client, tenant, make_member):
    client = token_client(admin)
    pk = RegistryCredential.objects.get().pk
    for path in (URL, f"{URL}{pk}/", "/api/v1/instances/", f"/api/v1/instances/{launched.pk}/",
                 f"/api/v1/instances/{launched.pk}/events/", "/api/v1/audit/"):  # fmt: skip
        response = client.get(path)
        assert response.status_code in (200, 403), path
        _clear(response.content.decode())
    owner = make_member(tenant, Role.OWNER)
    for page in ("/registry-credentials/", f"/instances/{launched.pk}/", "/audit/"):
        html = signed_in(owner).get(page).content.decode()
        _clear(html)
    assert "ci-bot" in signed_in(owner).get("/registry-credentials/").content.decode()


def test_a_refused_request_is_audited_masked(admin, token_client, other_tenant):
    theirs = RegistryCredential.objects.create(
        tenant=other_tenant, registry="ghcr.io", username="x", sealed_secret="x"
    )
    response = token_client(admin).delete(f"{URL}{theirs.pk}/", {"password": PASSWORD})
    assert response.status_code == 404
    member = token_client(admin)
    member.post(URL, {"registry": "bad registry", "username": "u", "password": PASSWORD})
    _clear(json.dumps(list(AuditEntry.objects.values()), default=str))


def test_a_page_post_shows_no_password_back(admin):
    page = signed_in(admin).post(
        "/registry-credentials/",
        {"registry": "not a host", "username": "ci-bot", "password": PASSWORD},
    )
    assert page.status_code == 200 and "host[:port]" in page.content.decode()
    _clear(page.content.decode())
    assert not RegistryCredential.objects.exists()


def test_the_agent_keeps_it_nowhere_on_disk(tmp_path):
    auth = parse_registry_auth(
        {"registry": "registry.example.com", "username": "ci-bot", "password": PASSWORD}
    )
    store = StateStore(tmp_path / "state")
    alloc = AgentAllocation(
        id="a-1", spec={"labels": {}, "mode": "whole", "gpus": [0], "mig": None, "shared": None},
        gpu_uuids=[], mig_uuid=None, env={}, state="starting",
        created_at="", updated_at="", pull_auth=auth,
    )  # fmt: skip
    store.save_allocations([alloc])
    for path in (tmp_path / "state").rglob("*"):
        if path.is_file():
            _clear(path.read_text())
    _clear(repr(alloc))
    _clear(json.dumps(alloc.view()))


@pytest.mark.parametrize(
    "value",
    [
        {"registry": "r", "username": "u"},
        {"registry": "r", "username": "u", "password": 1},
        {"registry": "r", "username": "u", "password": "", "extra": "x"},
        "r:u:p",
    ],
)
def test_the_agent_refuses_a_malformed_credential(value):
    assert parse_registry_auth(None) is None
    with pytest.raises(Exception) as refused:
        parse_registry_auth(value)
    assert "registry_auth" in str(refused.value)
