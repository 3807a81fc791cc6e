from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from accounts import services
from accounts.models import ApiToken, Tenant
from accounts.roles import Role
from console.catalog.models import Mode
from tests.conftest import ROLES
from tests.factories import ImageFactory, RegionFactory, SpecFactory, mig_profile

pytestmark = pytest.mark.django_db


@pytest.fixture
def catalog():
    RegionFactory()
    ImageFactory()
    quarter = SpecFactory(code="a100-quarter", milli=250, price_per_hour=Decimal("0.49"))
    mig = SpecFactory(
        code="a100-1g.10gb",
        mode=Mode.MIG,
        milli=None,
        mig_profile=mig_profile(quarter.gpu_model, "1g.10gb"),
        gpu_memory_mib=9984,
        price_per_hour=Decimal("0.29"),
    )
    whole = SpecFactory(
        code="a100-x2", mode=Mode.WHOLE, milli=None, gpu_count=2, price_per_hour=Decimal("3.78")
    )
    SpecFactory(code="retired", active=False)
    return {"quarter": quarter, "mig": mig, "whole": whole}


def test_specs_carry_the_contract_fields(catalog, tenant, make_member, token_client):
    client = token_client(make_member(tenant, Role.VIEWER))
    response = client.get("/api/v1/specs/")
    assert response.status_code == 200
    specs = {s["code"]: s for s in response.json()["results"]}
    assert set(specs) == {"a100-quarter", "a100-1g.10gb", "a100-x2"}  # not the retired one
    quarter = specs["a100-quarter"]
    assert quarter["gpu_equivalents"] == "0.25"
    assert quarter["price_per_hour"] == "0.49"
    assert quarter["mode"] == "shared"
    assert quarter["gpu_model"] == "a100-80gb"
    assert quarter["mig_profile"] is None
    for field in ["gpu_count", "gpu_memory_mib", "vcpus", "ram_mib", "disk_gib"]:
        assert isinstance(quarter[field], int)
    assert specs["a100-1g.10gb"]["mig_profile"] == "1g.10gb"
    assert specs["a100-1g.10gb"]["gpu_equivalents"] == "0.125"
    assert specs["a100-x2"]["gpu_equivalents"] == "2"
    assert client.get("/api/v1/specs/?mode=mig").json()["count"] == 1
    assert client.get("/api/v1/specs/a100-1g.10gb/").json()["code"] == "a100-1g.10gb"


def test_images_and_regions(catalog, tenant, make_member, token_client):
    client = token_client(make_member(tenant, Role.VIEWER))
    assert client.get("/api/v1/images/").json()["results"][0]["cuda_version"] == "12.4"
    assert client.get("/api/v1/regions/").json()["results"][0]["code"] == "local-1"


def test_quota_reports_limits_and_use(tenant, make_member, token_client):
    tenant.quota.gpu_quota = Decimal("1.5")
    tenant.quota.monthly_budget = Decimal("250.00")
    tenant.quota.save()
    body = token_client(make_member(tenant, Role.VIEWER)).get("/api/v1/quota/").json()
    assert body == {
        "gpu_quota": "1.5",
        "gpu_used": "0",
        "max_instances": 5,
        "instances_used": 0,
        "monthly_budget": "250.00",
        "budget_action": "alert",
    }


def test_no_credentials_is_401_json():
    response = APIClient().get("/api/v1/specs/")
    assert response.status_code == 401
    assert response.json()["code"] == "not_authenticated"
    assert response["WWW-Authenticate"] == "Bearer"


@pytest.mark.parametrize("header", ["Bearer", "Bearer garbage", "Bearer gpc_1234abcd_nope"])
def test_malformed_tokens_are_401(header):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    response = client.get("/api/v1/specs/")
    assert response.status_code == 401
    assert response.json()["code"] == "invalid_token"


def test_revoked_and_expired_tokens(tenant, make_member, token_client):
    member = make_member(tenant)
    client = token_client(member)
    token = ApiToken.objects.get()
    services.revoke_token(token)
    assert client.get("/api/v1/quota/").json()["code"] == "token_revoked"
    client = token_client(member)
    ApiToken.objects.filter(revoked_at__isnull=True).update(
        expires_at=timezone.now() - timedelta(minutes=1)
    )
    response = client.get("/api/v1/quota/")
    assert response.status_code == 401
    assert response.json()["code"] == "token_expired"


def test_suspended_tenant_token_and_session_refused(tenant, make_member, token_client):
    member = make_member(tenant)
    client = token_client(member)
    session = APIClient()
    session.force_login(member.user)
    services.set_tenant_status(tenant, Tenant.Status.SUSPENDED)
    for c in (client, session):
        response = c.get("/api/v1/quota/")
        assert response.status_code == 403
        assert response.json()["code"] == "tenant_suspended"


def test_session_auth_uses_chosen_tenant(tenant, other_tenant, make_member):
    member = make_member(tenant, Role.MEMBER, username="dana")
    make_member(other_tenant, Role.VIEWER, username="dana")
    other_tenant.quota.max_instances = 9
    other_tenant.quota.save()
    client = APIClient()
    client.force_login(member.user)
    assert client.get("/api/v1/quota/").json()["max_instances"] == 5
    client.post("/tenant/switch/", {"tenant": other_tenant.pk})
    assert client.get("/api/v1/quota/").json()["max_instances"] == 9


def test_token_acts_in_its_own_tenant_only(tenant, other_tenant, make_member, token_client):
    other_tenant.quota.max_instances = 42
    other_tenant.quota.save()
    body = token_client(make_member(tenant)).get("/api/v1/quota/").json()
    assert body["max_instances"] == 5


@pytest.mark.parametrize("role", ROLES)
def test_every_role_reads_the_catalog(role, catalog, tenant, make_member, token_client):
    client = token_client(make_member(tenant, role))
    for path in ["/api/v1/specs/", "/api/v1/images/", "/api/v1/regions/", "/api/v1/quota/"]:
        assert client.get(path).status_code == 200


def test_catalog_is_read_only(catalog, tenant, make_member, token_client):
    client = token_client(make_member(tenant, Role.OWNER))
    response = client.post("/api/v1/specs/", {"code": "x"}, format="json")
    assert response.status_code == 405
    assert response.json()["code"] == "method_not_allowed"


def test_unknown_api_path_is_json_404(tenant, make_member, token_client):
    response = token_client(make_member(tenant)).get("/api/v1/nothing-here/")
    assert response.status_code == 404
    assert response.json() == {"code": "not_found", "detail": "Not found."}


def test_user_without_tenant_is_refused():
    from tests.factories import UserFactory

    client = APIClient()
    client.force_login(UserFactory())
    response = client.get("/api/v1/quota/")
    assert response.status_code == 403
    assert response.json()["code"] == "no_tenant"


def test_openapi_schema_and_docs_are_served(client):
    schema = client.get("/api/v1/schema/")
    assert schema.status_code == 200
    assert b"/api/v1/specs/" in schema.content
    docs = client.get("/api/v1/docs/")
    assert docs.status_code == 200
    assert b"swagger-ui" in docs.content
    assert b"cdn" not in docs.content.lower()


def test_a_body_of_a_type_the_api_does_not_read_is_a_documented_415(
    tenant, make_member, token_client
):
    client = token_client(make_member(tenant, Role.OWNER))
    response = client.post("/api/v1/ssh-keys/", "name=laptop", content_type="text/plain")
    assert response.status_code == 415
    assert response.json()["code"] == "unsupported_media_type"
    document = client.get("/api/v1/schema/", HTTP_ACCEPT="application/json").json()
    assert "415" in document["paths"]["/api/v1/ssh-keys/"]["post"]["responses"]
    assert "415" not in document["paths"]["/api/v1/ssh-keys/"]["get"]["responses"]
