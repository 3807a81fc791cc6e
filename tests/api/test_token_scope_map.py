"""Every operation of the API's schema names exactly one scope of the fixed vocabulary
(accounts.scopes): a new endpoint without one fails here, and a scoped token could not use it."""

import pytest
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient

from accounts import scopes


def _operations():
    """(path, method, view) of every operation the API's OpenAPI document lists."""
    generator = SchemaGenerator()
    documented = generator.get_schema(request=None, public=True)["paths"]
    for path, _, method, callback in generator.endpoints:
        view = generator.create_view(callback, method)
        path = generator.coerce_path(path, method, view)
        if method.lower() in documented.get(path, {}):
            yield path, method, view


OPERATIONS = list(_operations())


def test_the_walk_finds_the_api():
    paths = {path for path, _, _ in OPERATIONS}
    assert {"/api/v1/instances/", "/api/v1/tokens/", "/api/v1/usage/"} <= paths
    assert len(OPERATIONS) > 20


@pytest.mark.parametrize(
    ("path", "method", "view"), OPERATIONS, ids=[f"{m} {p}" for p, m, _ in OPERATIONS]
)
def test_every_operation_names_a_scope_of_the_vocabulary(path, method, view):
    needed = scopes.required(view, method)
    assert needed is not None, f"{method} {path} names no token scope (api_scopes)"
    assert needed in scopes.BY_NAME, f"{method} {path}: {needed!r} is not in accounts.scopes"


def test_every_scope_opens_something():
    used = {scopes.required(view, method) for _, method, view in OPERATIONS}
    # instances:connect opens terminals and web ports, which are not REST operations
    assert set(scopes.BY_NAME) - used <= {"instances:connect"}


def test_instance_actions_each_have_their_own_scope():
    needed = {
        (path, method): scopes.required(view, method)
        for path, method, view in OPERATIONS
        if path.startswith("/api/v1/instances/")
    }
    assert needed[("/api/v1/instances/", "POST")] == "instances:launch"
    for action in ("stop", "start", "reboot", "terminate", "resize"):
        assert needed[(f"/api/v1/instances/{{id}}/{action}/", "POST")] == f"instances:{action}"
    assert needed[("/api/v1/instances/{id}/metrics/", "GET")] == "metrics:read"


@pytest.mark.django_db
def test_the_document_names_each_operations_scope():
    document = APIClient().get("/api/v1/schema/", HTTP_ACCEPT="application/json").json()
    for path, method, view in OPERATIONS:
        operation = document["paths"][path][method.lower()]
        assert operation["x-token-scope"] == scopes.required(view, method), (method, path)
        assert f"API token scope: `{operation['x-token-scope']}`." in operation["description"]
