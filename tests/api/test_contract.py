"""What generated clients rely on: the OpenAPI document describes the authentication, the
error shape and the responses the API really gives; list pages refuse what they cannot read."""

import pytest
from rest_framework.test import APIClient

from accounts.roles import Role
from tests.factories import ImageFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def schema():
    return APIClient().get("/api/v1/schema/", HTTP_ACCEPT="application/json").json()


def test_every_operation_documents_its_errors_in_the_one_error_shape(schema):
    error = {"$ref": "#/components/schemas/Error"}
    assert schema["components"]["schemas"]["Error"]["required"] == ["code", "detail"]
    operations = [
        (path, method, operation)
        for path, methods in schema["paths"].items()
        for method, operation in methods.items()
    ]
    assert operations
    for path, method, operation in operations:
        responses = operation["responses"]
        assert responses["401"]["content"]["application/json"]["schema"] == error, path
        if "{" in path:
            assert "404" in responses, (path, method)
        if operation.get("requestBody"):
            assert "400" in responses, (path, method)
    launch = schema["paths"]["/api/v1/instances/"]["post"]["responses"]
    assert {"202", "400", "401", "403", "409"} <= set(launch)


def test_the_document_names_bearer_tokens_and_the_real_shapes(schema):
    assert schema["components"]["securitySchemes"]["apiToken"] == {
        "type": "http",
        "scheme": "bearer",
        "description": schema["components"]["securitySchemes"]["apiToken"]["description"],
    }
    spec = schema["components"]["schemas"]["Spec"]["properties"]
    assert spec["mig_profile"].get("nullable") and spec["milli"].get("nullable")
    month = schema["components"]["schemas"]["UsageReport"]["properties"]["month"]
    assert month["pattern"] == "^[0-9]{4}-[0-9]{2}$"  # ASCII digits, as parse_month reads
    assert not [path for path in schema["paths"] if path.startswith("/agent/")]


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("limit=ten", "limit"),
        ("limit=0", "limit"),
        ("offset=-1", "offset"),
        ("offset=1O", "offset"),
    ],
)
def test_a_page_it_cannot_read_is_a_400_naming_the_parameter(
    tenant, make_member, token_client, query, field
):
    client = token_client(make_member(tenant, Role.VIEWER))
    response = client.get(f"/api/v1/images/?{query}")
    assert response.status_code == 400
    assert response.json()["code"] == "invalid"
    assert field in response.json()["errors"]


def test_pages_are_read_and_capped(tenant, make_member, token_client):
    for name in ("ubuntu", "pytorch", "vllm"):
        ImageFactory(name=name)
    client = token_client(make_member(tenant, Role.VIEWER))
    page = client.get("/api/v1/images/?limit=2&offset=1").json()
    assert (page["count"], len(page["results"])) == (3, 2)
    for query, count, shown in [
        ("limit=3", 3, 3),  # the whole list in one page
        ("limit=2", 3, 2),  # more follow
        ("limit=2&offset=2", 3, 1),  # the last page
        ("offset=7", 3, 0),  # past the end
        (f"offset={2**63 - 1}", 3, 0),  # past any list
    ]:
        page = client.get(f"/api/v1/images/?{query}").json()
        assert (page["count"], len(page["results"])) == (count, shown), query
    assert len(client.get("/api/v1/images/?limit=100000").json()["results"]) == 3
    too_far = client.get(f"/api/v1/images/?offset={10**30}")  # past any database's integers
    assert too_far.status_code == 400 and "offset" in too_far.json()["errors"]
