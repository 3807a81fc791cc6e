"""Scoped API tokens (issue 29, item 4): a token does only what its scopes name (403 naming the
missing scope), sees only the instances its name prefix allows (others are 404), expires
(401), never exceeds its user's role, and the tokens that existed before keep their powers."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from accounts import scopes, services
from accounts.models import ApiToken
from accounts.roles import Role
from console.asgi import application
from console.catalog.models import Mode
from console.fleet.models import Gpu, Host
from console.instances import access
from console.instances.models import Instance, State
from tests.api.test_token_scope_map import OPERATIONS
from tests.factories import ImageFactory, RegionFactory, SpecFactory
from tests.metrics.communicator import WebsocketCommunicator, run
from tests.metrics.conftest import world  # noqa: F401 - a fixture of these tests

pytestmark = pytest.mark.django_db


def client_of(membership, **limits) -> APIClient:
    issued = services.issue_token(membership.user, membership.tenant, "scoped", **limits)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.raw}")
    client.token = issued.token
    return client


@pytest.fixture
def owner(tenant, make_member):
    return make_member(tenant, Role.OWNER)


@pytest.fixture
def fleet(tenant):
    """A spec that can queue (a cordoned host could hold it), and three instances of the
    tenant: ci-1 and ci-2 (running), prod-db (stopped)."""
    region = RegionFactory()
    image = ImageFactory()
    spec = SpecFactory(code="a100-quarter")
    cordoned = Host.Status.CORDONED
    host = Host(name="cordoned", region=region, address="http://127.0.0.1:9", status=cordoned,
                admin_status=cordoned)  # fmt: skip
    host.set_secret("secret-cordoned")
    host.save()
    Gpu.objects.create(
        host=host, index=0, uuid="GPU-cordoned-0", model=spec.gpu_model, name="A100",
        memory_mib=81920, mode=Mode.SHARED,
    )  # fmt: skip

    def instance(name, state):
        return Instance.objects.create(
            tenant=tenant, name=name, spec=spec, image=image, region=region, state=state
        )

    return {
        "ci-1": instance("ci-1", State.RUNNING),
        "ci-2": instance("ci-2", State.RUNNING),
        "prod-db": instance("prod-db", State.STOPPED),
    }


def concrete(path: str) -> str:
    """The schema's path with every {parameter} as 1 (the scope is checked before any
    lookup)."""
    out, depth = [], 0
    for char in path:
        if char == "{":
            depth += 1
            out.append("1")
        elif char == "}":
            depth -= 1
        elif not depth:
            out.append(char)
    return "".join(out)


@pytest.mark.parametrize(
    ("path", "method", "view"), OPERATIONS, ids=[f"{m} {p}" for p, m, _ in OPERATIONS]
)
def test_every_operation_refuses_a_token_without_its_scope(owner, path, method, view):
    needed = scopes.required(view, method)
    others = [name for name in scopes.BY_NAME if name != needed]
    client = client_of(owner, scopes=others)
    response = client.generic(method, concrete(path), "{}", content_type="application/json")
    assert response.status_code == 403, (method, path, response.content)
    assert response.json() == {
        "code": "scope_missing",
        "detail": f"This token lacks the scope {needed}.",
        "required_scope": needed,
    }
    allowed = client_of(owner, scopes=[needed])
    response = allowed.generic(method, concrete(path), "{}", content_type="application/json")
    assert response.status_code < 500, (method, path, response.content)
    assert response.json().get("code") != "scope_missing", (method, path)


def test_a_group_wildcard_holds_each_scope_of_its_group(owner, fleet):
    client = client_of(owner, scopes=["instances:*"])
    assert client.get("/api/v1/instances/").status_code == 200
    stop = client.post(f"/api/v1/instances/{fleet['ci-1'].pk}/stop/")
    assert stop.status_code == 202
    refused = client.get("/api/v1/usage/")
    assert refused.status_code == 403 and refused.json()["required_scope"] == "billing:read"


def test_read_and_stop_only(owner, fleet):
    client = client_of(owner, scopes=["instances:read", "instances:stop"])
    assert client.get("/api/v1/instances/").json()["count"] == 3
    assert client.post(f"/api/v1/instances/{fleet['ci-1'].pk}/stop/").status_code == 202
    for action in ("start", "reboot", "terminate"):
        response = client.post(f"/api/v1/instances/{fleet['ci-2'].pk}/{action}/")
        assert response.status_code == 403
        assert response.json()["required_scope"] == f"instances:{action}"
    launch = client.post("/api/v1/instances/", {"spec": "a100-quarter"}, format="json")
    assert launch.json()["required_scope"] == "instances:launch"
    fleet["ci-2"].refresh_from_db()
    assert fleet["ci-2"].state == State.RUNNING


# --- prefix -------------------------------------------------------------------------------


def test_a_prefix_token_lists_only_its_instances(owner, fleet):
    client = client_of(owner, scopes=["instances:*", "metrics:read"], instance_prefix="ci-")
    names = {row["name"] for row in client.get("/api/v1/instances/").json()["results"]}
    assert names == {"ci-1", "ci-2"}
    assert client.get("/api/v1/instances/?name=prod-db").json()["count"] == 0
    assert client.get("/api/v1/instances/?state=stopped").json()["count"] == 0


@pytest.mark.parametrize(
    ("method", "suffix"),
    [
        ("get", ""),
        ("get", "events/"),
        ("get", "logs/"),
        ("get", "metrics/"),
        ("post", "start/"),
        ("post", "stop/"),
        ("post", "terminate/"),
        ("post", "reboot/"),
    ],
)
def test_another_name_is_not_found_for_a_prefix_token(owner, fleet, method, suffix):
    client = client_of(owner, instance_prefix="ci-")
    response = getattr(client, method)(f"/api/v1/instances/{fleet['prod-db'].pk}/{suffix}")
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"
    fleet["prod-db"].refresh_from_db()
    assert fleet["prod-db"].state == State.STOPPED


def test_a_prefix_token_reads_and_acts_on_its_own(owner, fleet):
    client = client_of(owner, instance_prefix="ci-")
    assert client.get(f"/api/v1/instances/{fleet['ci-1'].pk}/").json()["name"] == "ci-1"
    assert client.get(f"/api/v1/instances/{fleet['ci-1'].pk}/metrics/").status_code == 200
    assert client.post(f"/api/v1/instances/{fleet['ci-1'].pk}/stop/").status_code == 202


@pytest.mark.parametrize("name", ["prod-web", "xci-1", None, ""])
def test_a_prefix_token_launches_no_name_outside_it(owner, fleet, name):
    client = client_of(owner, scopes=["instances:launch"], instance_prefix="ci-")
    body = {"spec": "a100-quarter", **({"name": name} if name is not None else {})}
    response = client.post("/api/v1/instances/", body, format="json")
    assert response.status_code == 400
    assert response.json()["errors"]["name"] == [
        'This API token launches only instances whose name starts with "ci-": name the instance so.'
    ]
    assert not Instance.objects.exclude(name__in=list(fleet)).exists()


def test_a_prefix_token_launches_a_name_inside_it(owner, fleet):
    client = client_of(owner, scopes=["instances:launch"], instance_prefix="ci-")
    response = client.post(
        "/api/v1/instances/", {"spec": "a100-quarter", "name": "ci-3"}, format="json"
    )
    assert response.status_code == 202, response.content
    assert response.json()["name"] == "ci-3"


def test_a_prefix_token_gets_nothing_that_shows_every_instance(owner, fleet):
    client = client_of(owner, instance_prefix="ci-")
    response = client.get("/api/v1/usage/")
    assert response.status_code == 403
    assert response.json()["code"] == "prefix_confined"
    with pytest.raises(Exception, match="billing:read shows every instance"):
        services.issue_token(
            owner.user, owner.tenant, "x", scopes=["billing:read"], instance_prefix="ci-"
        )


def test_terminals_and_ports_need_connect_and_the_prefix(owner, fleet):
    membership = services.authenticate_token(
        services.issue_token(owner.user, owner.tenant, "t", scopes=["instances:read"]).raw
    )[1]
    with pytest.raises(access.ConnectRefused) as refused:
        access.target(membership, fleet["ci-1"].pk)
    assert (refused.value.status, refused.value.close_code) == (403, 4403)
    assert refused.value.detail == "This token lacks the scope instances:connect."
    confined = services.authenticate_token(
        services.issue_token(owner.user, owner.tenant, "t", instance_prefix="ci-").raw
    )[1]
    with pytest.raises(access.ConnectRefused) as refused:
        access.target(confined, fleet["prod-db"].pk)
    assert (refused.value.status, refused.value.close_code) == (404, 4404)
    assert not access.shell_member(membership)


# --- expiry, role, read-only, old tokens ---------------------------------------------------


def test_an_expired_token_is_a_401_saying_so(owner, fleet):
    client = client_of(
        owner, scopes=["instances:read"], expires_at=timezone.now() + timedelta(hours=1)
    )
    assert client.get("/api/v1/instances/").status_code == 200
    ApiToken.objects.filter(pk=client.token.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    response = client.get("/api/v1/instances/")
    assert response.status_code == 401
    assert response.json() == {"code": "token_expired", "detail": "This API token has expired."}


def test_a_token_never_exceeds_its_users_role(tenant, make_member, fleet):
    member = make_member(tenant, Role.MEMBER)
    client = client_of(member, scopes=["instances:stop", "instances:read"])
    member.role = Role.VIEWER
    member.save()
    response = client.post(f"/api/v1/instances/{fleet['ci-1'].pk}/stop/")
    assert response.status_code == 403
    assert response.json()["code"] == "permission_denied"
    viewer = make_member(tenant, Role.VIEWER)
    with pytest.raises(Exception, match=r"cannot hold instances:stop"):
        services.issue_token(viewer.user, tenant, "x", scopes=["instances:stop"])
    with pytest.raises(Exception, match=r"Your role \(member\) cannot grant audit:read"):
        services.issue_token(make_member(tenant).user, tenant, "x", scopes=["audit:read"])


def test_a_read_only_token_is_as_it_was(tenant, make_member, fleet):
    client = client_of(make_member(tenant, Role.ADMIN), read_only=True)
    assert client.token.scopes is None
    assert client.get("/api/v1/instances/").json()["count"] == 3
    assert client.get("/api/v1/usage/").status_code == 200
    response = client.post(f"/api/v1/instances/{fleet['ci-1'].pk}/stop/")
    assert response.status_code == 403
    assert response.json() == {
        "code": "permission_denied",
        "detail": "This API token is read-only; it acts as a viewer, who cannot do this.",
    }


def test_an_unscoped_token_does_what_its_role_allows(owner, fleet):
    client = client_of(owner)
    assert client.token.scopes is None and client.token.instance_prefix == ""
    assert client.get("/api/v1/usage/").status_code == 200
    assert client.get("/api/v1/instances/").json()["count"] == 3
    assert client.post(f"/api/v1/instances/{fleet['prod-db'].pk}/start/").status_code == 202


# --- websockets ----------------------------------------------------------------------------


def _opens(path: str, raw: str) -> tuple[bool, object]:
    """(True, subprotocol) when a socket with the token opens, (False, close code) if not."""
    result = {}

    async def scenario():
        headers = [(b"host", b"testserver"), (b"authorization", f"Bearer {raw}".encode())]
        client = WebsocketCommunicator(application, path, headers=headers)
        result["opened"] = await client.connect()
        if result["opened"][0]:
            await client.disconnect()

    run(scenario)
    return result["opened"]


def _raw(membership, **limits) -> str:
    return services.issue_token(membership.user, membership.tenant, "ws", **limits).raw


@pytest.mark.django_db(transaction=True)
def test_sockets_need_their_scope(world):  # noqa: F811
    """tests/metrics' world: acme's `train` and `big` running; alice a viewer of acme."""
    alice, train = world.alice, world.train.pk
    metrics_only = _raw(alice, scopes=["metrics:read"])
    assert _opens("/ws/events/", metrics_only) == (False, 4403)
    assert _opens("/ws/metrics/", metrics_only)[0]
    assert _opens(f"/ws/instances/{train}/metrics/", metrics_only)[0]
    events_only = _raw(alice, scopes=["instances:read"])
    assert _opens("/ws/events/", events_only)[0]
    assert _opens("/ws/metrics/", events_only) == (False, 4403)
    assert _opens(f"/ws/instances/{train}/metrics/", events_only) == (False, 4403)


@pytest.mark.django_db(transaction=True)
def test_a_prefix_token_gets_only_its_instances_sockets(world):  # noqa: F811
    confined = _raw(world.alice, instance_prefix="tr")
    assert _opens(f"/ws/instances/{world.train.pk}/metrics/", confined)[0]
    assert _opens(f"/ws/instances/{world.big.pk}/metrics/", confined) == (False, 4404)
    assert _opens("/ws/metrics/", confined) == (False, 4403)
    assert _opens("/ws/events/", confined) == (False, 4403)


@pytest.mark.django_db(transaction=True)
def test_a_limited_token_of_an_operator_opens_no_fleet_socket(world):  # noqa: F811
    user = world.alice.user
    user.is_staff = True
    user.save()
    assert _opens("/ws/fleet/metrics/", _raw(world.alice))[0]
    assert _opens("/ws/fleet/metrics/", _raw(world.alice, scopes=["metrics:read"]))[0] is False
    assert _opens("/ws/fleet/metrics/", _raw(world.alice, instance_prefix="tr"))[0] is False
