"""/api/v1/registry-credentials/: admins and owners add (or replace), list and remove the
tenant's credentials; the token is write-only; another tenant's is not found; a scoped token
needs registries:*; members and viewers are refused (they use credentials only through a
launch)."""

import pytest

from accounts import services as account_services
from accounts.roles import Role
from console import secret_env
from console.registry_credentials import services
from console.registry_credentials.models import RegistryCredential

URL = "/api/v1/registry-credentials/"
SECRET = "tok-3f9Zq-distinctive"


@pytest.fixture
def admin(tenant, make_member):
    return make_member(tenant, Role.ADMIN, username="ada")


@pytest.fixture
def api(admin, token_client):
    return token_client(admin)


def body(**extra) -> dict:
    return {"registry": "ghcr.io", "username": "ci-bot", "password": SECRET, **extra}


def test_write_only(api, tenant):
    created = api.post(URL, body(), format="json")
    assert created.status_code == 201, created.json()
    shown = created.json()
    assert set(shown) == {"id", "registry", "username", "created_at", "last_used_at"}
    assert SECRET not in created.content.decode()
    listed = api.get(URL)
    assert [row["registry"] for row in listed.json()["results"]] == ["ghcr.io"]
    detail = api.get(f"{URL}{shown['id']}/")
    for response in (listed, detail):
        assert response.status_code == 200 and SECRET not in response.content.decode()
    stored = RegistryCredential.objects.get()
    assert SECRET not in stored.sealed_secret  # sealed, not in clear
    assert secret_env.open_all({"s": stored.sealed_secret}) == {"s": SECRET}


def test_a_second_one_for_a_registry_replaces_it(api):
    api.post(URL, body(), format="json")
    again = api.post(URL, body(username="deploy", password="new-token"), format="json")
    assert again.status_code == 201
    stored = RegistryCredential.objects.get()
    assert stored.username == "deploy"
    auth = services.pull_auth(stored.tenant_id, "ghcr.io/team/app:1")
    assert auth == {"registry": "ghcr.io", "username": "deploy", "password": "new-token"}


@pytest.mark.parametrize(
    "field, value",
    [
        ("registry", "https://ghcr.io"),
        ("registry", "localhost"),
        ("registry", "ghcr.io/team"),
        ("username", "ci bot"),
        ("password", ""),
        ("password", "a\nb"),
        ("password", "x" * 5000),
    ],
)
def test_bad_fields_are_field_errors(api, field, value):
    response = api.post(URL, body(**{field: value}), format="json")
    assert response.status_code == 400
    assert field in response.json()["errors"]
    assert not RegistryCredential.objects.exists()


def test_remove(api):
    pk = api.post(URL, body(), format="json").json()["id"]
    assert api.delete(f"{URL}{pk}/").status_code == 204
    assert not RegistryCredential.objects.exists()


def test_another_tenants_is_not_found(api, other_tenant):
    theirs = services.save_credential(
        other_tenant, registry="ghcr.io", username="x", password="theirs"
    )
    assert api.get(f"{URL}{theirs.pk}/").status_code == 404
    assert api.delete(f"{URL}{theirs.pk}/").status_code == 404
    assert api.get(URL).json()["results"] == []
    assert RegistryCredential.objects.filter(pk=theirs.pk).exists()


@pytest.mark.parametrize("role", [Role.MEMBER, Role.VIEWER])
def test_members_and_viewers_are_refused(tenant, make_member, token_client, role):
    client = token_client(make_member(tenant, role))
    assert client.get(URL).status_code == 403
    assert client.post(URL, body(), format="json").status_code == 403
    assert not RegistryCredential.objects.exists()


def test_a_scoped_token_needs_the_scope(admin):
    from rest_framework.test import APIClient

    def client(scopes):
        issued = account_services.issue_token(admin.user, admin.tenant, "t", scopes=scopes)
        made = APIClient()
        made.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.raw}")
        return made

    narrow = client(["instances:read"])
    refused = narrow.post(URL, body(), format="json")
    assert refused.status_code == 403
    assert "registries:write" in refused.content.decode()
    assert narrow.get(URL).status_code == 403
    allowed = client(["registries:read", "registries:write"])
    assert allowed.post(URL, body(), format="json").status_code == 201
    assert allowed.get(URL).status_code == 200


def test_pull_auth_only_for_that_registry(tenant):
    services.save_credential(tenant, registry="127.0.0.1:5000", username="u", password="p")
    assert services.pull_auth(tenant.pk, "127.0.0.1:5000/team/app:1")["password"] == "p"
    assert services.pull_auth(tenant.pk, "ghcr.io/team/app:1") is None
    assert services.pull_auth(tenant.pk, "ubuntu") is None
    assert RegistryCredential.objects.get().last_used_at is not None
