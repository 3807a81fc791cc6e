"""What an attacker inside a tenant tries and is refused is on the tenant's record (issue 41):
through the real ASGI server, a viewer's stop, a scoped token's out-of-scope terminate, an
over-quota launch carrying a secret and a stop of a terminated instance are each one audit entry
with its error code, which the tenant's admin reads, and the secret is in none of it; the same
refusals through the console's pages are recorded as the API's are."""

import json
import re
from decimal import Decimal

import httpx
import pytest

from accounts import services as accounts
from accounts.models import Quota
from accounts.roles import Role
from console.audit.models import AuditEntry
from console.instances.models import State
from tests.factories import MembershipFactory, UserFactory
from tests.instances.conftest import stack, stack_env  # noqa: F401 - fixtures
from tests.instances.e2e import api_client, make_tenant
from tests.instances.helpers import make_instance

pytestmark = [pytest.mark.integration]

SECRET = "hf_sEcReT-of-the-refused-launch"
PASSWORD = "correct-horse-battery"  # make_tenant's
CSRF = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


def _signed_in(stack, user) -> httpx.Client:  # noqa: F811
    """A browser's session of `user` (its password PASSWORD) on the real server."""
    client = httpx.Client(base_url=stack.url, timeout=10)
    token = CSRF.search(client.get("/login/").text)[1]
    form = {"username": user.username, "password": PASSWORD, "csrfmiddlewaretoken": token}
    assert client.post("/login/", data=form).status_code == 302
    return client


def test_refused_attempts_are_recorded_without_their_secrets(stack, catalog):  # noqa: F811
    catalog.cordoned()  # hardware for the spec, none of it free
    tenant, member = make_tenant(gpu="0")
    viewer = MembershipFactory(user=UserFactory(username="vic"), tenant=tenant, role=Role.VIEWER)
    admin = MembershipFactory(user=UserFactory(username="ada"), tenant=tenant, role=Role.ADMIN)
    running = make_instance(catalog, tenant, state=State.RUNNING)
    gone = make_instance(catalog, tenant, state=State.TERMINATED)
    scoped = accounts.issue_token(member.user, tenant, "ci", scopes=["instances:read"])

    assert api_client(stack, viewer).post(f"/instances/{running.pk}/stop/").status_code == 403
    ci = api_client(stack, member)
    ci.headers["Authorization"] = f"Bearer {scoped.raw}"
    assert ci.post(f"/instances/{running.pk}/terminate/", json={}).status_code == 403
    api = api_client(stack, member)
    body = {"name": "x", "spec": "a100-quarter", "image": catalog.image.name}
    body["secret_env"] = {"HF": SECRET}
    assert api.post("/instances/", json=body).status_code == 409
    assert api.post(f"/instances/{gone.pk}/stop/").status_code == 409

    refused = api_client(stack, admin).get("/audit/", params={"outcome": "refused"}).json()
    assert [(row["action"], row["error_code"]) for row in reversed(refused["results"])] == [
        ("instance.stop", "permission_denied"),
        ("instance.terminate", "scope_missing"),
        ("instance.launch", "quota_exceeded"),
        ("instance.stop", "invalid_state"),
    ]
    assert {row["tenant"] for row in refused["results"]} == {tenant.slug}
    assert SECRET not in json.dumps(refused)
    assert SECRET not in json.dumps(list(AuditEntry.objects.values()), default=str)
    running.refresh_from_db()
    assert running.state == State.RUNNING
    assert Quota.objects.get(tenant=tenant).gpu_quota == Decimal(0)


def test_refused_page_posts_are_recorded_as_the_apis(stack, catalog):  # noqa: F811
    tenant, member = make_tenant()
    _, stranger = make_tenant(slug="globex", username="sam")
    user = UserFactory(username="vic")
    user.set_password(PASSWORD)
    user.save()
    viewer = MembershipFactory(user=user, tenant=tenant, role=Role.VIEWER)
    admin = MembershipFactory(user=UserFactory(username="ada"), tenant=tenant, role=Role.ADMIN)
    running = make_instance(catalog, tenant, state=State.RUNNING)
    theirs = make_instance(catalog, stranger.tenant, state=State.RUNNING)

    posted = []
    for membership, path, answer in [
        (viewer, f"/instances/{running.pk}/stop/", 302),
        (member, f"/instances/{theirs.pk}/terminate/", 404),
    ]:
        page = _signed_in(stack, membership.user)
        form = {"csrfmiddlewaretoken": page.cookies["csrftoken"], "confirm": "1"}
        assert page.post(path, data=form).status_code == answer
        posted.append(form["csrfmiddlewaretoken"])

    refused = api_client(stack, admin).get("/audit/", params={"outcome": "refused"}).json()
    assert [(row["action"], row["error_code"]) for row in reversed(refused["results"])] == [
        ("instance.stop", "permission_denied"),
        ("instance.terminate", "not_found"),
    ]
    kept = json.dumps(list(AuditEntry.objects.values()), default=str)
    assert not any(token in kept for token in posted)
    assert AuditEntry.objects.filter(tenant=stranger.tenant).count() == 0
    running.refresh_from_db(), theirs.refresh_from_db()
    assert running.state == theirs.state == State.RUNNING
