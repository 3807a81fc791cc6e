import pytest
from django.contrib.auth import get_user_model
from django.contrib.messages import get_messages
from rest_framework.test import APIClient

from accounts import invitations, services
from accounts.models import ApiToken, Invitation, Membership, Tenant
from accounts.roles import Role
from tests.conftest import ROLES

pytestmark = pytest.mark.django_db


def login(client, membership):
    client.force_login(membership.user)
    client.post("/tenant/switch/", {"tenant": membership.tenant_id})
    return client


def flash(response) -> str:
    return " ".join(str(m) for m in get_messages(response.wsgi_request))


def test_anonymous_goes_to_login(client):
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_login_form_signs_in(client, tenant, make_member):
    make_member(tenant, Role.MEMBER, username="erin")
    response = client.post("/login/", {"username": "erin", "password": "correct-horse-battery"})
    assert response.status_code == 302
    page = client.get("/")
    assert b"Acme AI" in page.content
    assert b"GPU quota used" in page.content


def test_wrong_password_shows_error(client, tenant, make_member):
    make_member(tenant, Role.MEMBER, username="erin")
    response = client.post("/login/", {"username": "erin", "password": "nope"})
    assert response.status_code == 200
    assert b"correct username and password" in response.content


def test_dashboard_shows_quota(client, tenant, make_member):
    page = login(client, make_member(tenant, Role.VIEWER)).get("/")
    assert b"0 / 2" in page.content  # GPU-equivalents used / quota
    assert b"Launch instance" not in page.content  # viewers cannot launch


def test_switching_to_a_tenant_you_do_not_belong_to_is_refused(
    client, tenant, other_tenant, make_member
):
    login(client, make_member(tenant))
    response = client.post("/tenant/switch/", {"tenant": other_tenant.pk})
    assert "not a member" in flash(response)
    assert b"Acme AI" in client.get("/").content


def test_suspended_tenant_console_is_refused(client, tenant, make_member):
    login(client, make_member(tenant))
    services.set_tenant_status(tenant, Tenant.Status.SUSPENDED)
    response = client.get("/")
    assert response.status_code == 403
    assert b"tenant_suspended" in response.content


# Roles × console actions: (action, minimum role)
ACTIONS = {
    "invite": Role.ADMIN,
    "revoke_invitation": Role.ADMIN,
    "change_role": Role.ADMIN,
    "remove_member": Role.ADMIN,
    "create_token": Role.VIEWER,  # for themselves; a viewer's is read-only
    "revoke_token": Role.ADMIN,  # someone else's
    "revoke_own_token": Role.VIEWER,
}
RANK = {r: i for i, r in enumerate(ROLES)}


def perform(client, action, tenant, make_member):
    target = make_member(tenant, Role.VIEWER, username=f"target-{action}")
    if action == "invite":
        client.post("/members/", {"email": "newbie@example.com", "role": Role.MEMBER})
        return Invitation.objects.filter(email="newbie@example.com", tenant=tenant).exists()
    if action == "revoke_invitation":
        owner = make_member(tenant, Role.OWNER, username="inviter")
        invitation = invitations.invite(owner, "newbie@example.com", Role.MEMBER, str)
        client.post(f"/members/invitations/{invitation.pk}/revoke/")
        invitation.refresh_from_db()
        return invitation.state == "revoked"
    if action == "change_role":
        client.post(f"/members/{target.pk}/role/", {"role": Role.MEMBER})
        target.refresh_from_db()
        return target.role == Role.MEMBER
    if action == "remove_member":
        client.post(f"/members/{target.pk}/remove/")
        return not Membership.objects.filter(pk=target.pk).exists()
    if action == "create_token":
        client.post("/tokens/", {"name": "from-test"})
        return ApiToken.objects.filter(name="from-test").exists()
    if action == "revoke_token":
        owner = make_member(tenant, Role.OWNER, username="token-owner")
        issued = services.issue_token(owner.user, tenant, "victim")
        client.post(f"/tokens/{issued.token.pk}/revoke/")
        issued.token.refresh_from_db()
        return issued.token.is_revoked
    if action == "revoke_own_token":
        signed_in = get_user_model().objects.get(pk=client.session["_auth_user_id"])
        issued = services.issue_token(signed_in, tenant, "mine")
        client.post(f"/tokens/{issued.token.pk}/revoke/")
        issued.token.refresh_from_db()
        return issued.token.is_revoked
    raise AssertionError(action)


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("action", ACTIONS)
def test_roles_by_console_action(client, tenant, make_member, role, action):
    login(client, make_member(tenant, role))
    allowed = RANK[role] >= RANK[ACTIONS[action]]
    assert perform(client, action, tenant, make_member) is allowed


def test_members_of_another_tenant_are_404(client, tenant, other_tenant, make_member):
    login(client, make_member(tenant, Role.OWNER))
    foreign = make_member(other_tenant, Role.MEMBER)
    assert client.post(f"/members/{foreign.pk}/role/", {"role": Role.VIEWER}).status_code == 404
    assert client.post(f"/members/{foreign.pk}/remove/").status_code == 404
    issued = services.issue_token(foreign.user, other_tenant, "theirs")
    assert client.post(f"/tokens/{issued.token.pk}/revoke/").status_code == 404
    foreign.refresh_from_db()
    assert foreign.role == Role.MEMBER


def test_last_owner_cannot_be_removed_from_the_page(client, tenant, make_member):
    owner = make_member(tenant, Role.OWNER)
    login(client, owner)
    response = client.post(f"/members/{owner.pk}/remove/")
    assert "last owner" in flash(response)
    assert Membership.objects.filter(pk=owner.pk).exists()


def test_admin_cannot_make_an_owner(client, tenant, make_member):
    login(client, make_member(tenant, Role.ADMIN))
    target = make_member(tenant, Role.MEMBER)
    response = client.post(f"/members/{target.pk}/role/", {"role": Role.OWNER})
    assert "Only an owner" in flash(response)
    target.refresh_from_db()
    assert target.role == Role.MEMBER


def test_token_is_shown_once(client, tenant, make_member):
    login(client, make_member(tenant, Role.ADMIN))
    created = client.post("/tokens/", {"name": "ci", "expires_in_days": "30"}, follow=True)
    token = ApiToken.objects.get(name="ci")
    assert f"gpc_{token.prefix}_".encode() in created.content
    assert token.expires_at is not None
    listed = client.get("/tokens/")
    assert b"ci" in listed.content
    assert f"gpc_{token.prefix}_…".encode() in listed.content
    assert b'data-testid="new-token"' not in listed.content


def test_members_see_only_their_own_tokens(client, tenant, make_member):
    admin = make_member(tenant, Role.ADMIN)
    services.issue_token(admin.user, tenant, "admins-token")
    member = make_member(tenant, Role.MEMBER)
    services.issue_token(member.user, tenant, "my-token")
    page = login(client, member).get("/tokens/")
    assert b"my-token" in page.content
    assert b"admins-token" not in page.content


def test_a_viewers_tokens_read_only_and_the_page_says_so(client, tenant, make_member):
    api_client = APIClient()
    viewer = make_member(tenant, Role.VIEWER)
    login(client, viewer)
    page = client.get("/tokens/").content.decode()
    assert 'data-testid="read-only-explained"' in page and "read-only" in page
    assert "Create read-only token" in page and 'name="read_only"' not in page
    created = client.post("/tokens/", {"name": "dash", "read_only": ""}, follow=True)
    raw = created.content.decode().split('id="new-token-value">')[1].split("<")[0]
    token = ApiToken.objects.get(name="dash")
    assert token.read_only  # whatever the form said
    assert "read only" in client.get("/tokens/").content.decode()

    api_client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert api_client.get("/api/v1/instances/").status_code == 200
    assert api_client.get("/api/v1/usage/").status_code == 200
    refused = api_client.post("/api/v1/ssh-keys/", {"name": "k", "public_key": "x"})
    assert refused.status_code == 403
    assert refused.json()["detail"].startswith("This API token is read-only")

    viewer.role = Role.MEMBER  # promoted later: the token stays what it was made
    viewer.save(update_fields=["role"])
    assert api_client.post("/api/v1/ssh-keys/", {"name": "k", "public_key": "x"}).status_code == 403


def test_a_member_may_make_a_read_only_token_that_cannot_write(client, tenant, make_member):
    api_client = APIClient()
    owner = make_member(tenant, Role.OWNER)
    login(client, owner)
    page = client.get("/tokens/").content.decode()
    assert 'name="read_only"' in page and "read-only-explained" not in page
    created = client.post("/tokens/", {"name": "reports", "read_only": "on"}, follow=True)
    raw = created.content.decode().split('id="new-token-value">')[1].split("<")[0]
    assert ApiToken.objects.get(name="reports").read_only
    api_client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert api_client.get("/api/v1/quota/").status_code == 200
    refused = api_client.post("/api/v1/ssh-keys/", {"name": "k", "public_key": "x"})
    assert refused.status_code == 403 and "read-only" in refused.json()["detail"]
    writer = services.issue_token(owner.user, tenant, "writer").raw
    api_client.credentials(HTTP_AUTHORIZATION=f"Bearer {writer}")
    assert api_client.post("/api/v1/ssh-keys/", {"name": "k", "public_key": "x"}).status_code == 400
