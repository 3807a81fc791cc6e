"""A web port (the port proxy) with a scoped API token: it needs instances:connect, and a
prefix-confined token reaches only the ports of its own instances (issue 29, item 4)."""

import pytest

from accounts import services
from accounts.roles import Role
from tests.instances.test_ports import agent, fetch, jupyter, origin  # noqa: F401 - fixtures

pytestmark = pytest.mark.usefixtures("no_tasks")


def headers(membership, **limits) -> list[tuple[str, str]]:
    raw = services.issue_token(membership.user, membership.tenant, "port", **limits).raw
    return [("Authorization", f"Bearer {raw}")]


def test_a_port_needs_instances_connect(
    transactional_db,
    tenant,
    make_member,
    jupyter,  # noqa: F811
    agent,  # noqa: F811
):
    owner = make_member(tenant, Role.OWNER)
    refused = fetch(origin(jupyter.pk), "GET", "/", headers(owner, scopes=["instances:read"]))
    assert refused.status_code == 403
    assert refused.json() == {
        "code": "scope_missing",
        "detail": "This token lacks the scope instances:connect.",
    }
    assert agent.seen == []
    allowed = fetch(origin(jupyter.pk), "GET", "/", headers(owner, scopes=["instances:connect"]))
    assert allowed.status_code == 200


def test_a_prefix_token_reaches_only_its_instances_ports(
    transactional_db,
    tenant,
    make_member,
    jupyter,  # noqa: F811
    agent,  # noqa: F811
):
    owner = make_member(tenant, Role.OWNER)
    outside = fetch(origin(jupyter.pk), "GET", "/", headers(owner, instance_prefix="ci-"))
    assert (outside.status_code, outside.json()["code"]) == (404, "not_found")
    inside = fetch(origin(jupyter.pk), "GET", "/", headers(owner, instance_prefix="n"))
    assert inside.status_code == 200
