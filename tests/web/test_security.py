"""Findings of the outside security review (issue 12) on the console pages."""

import pytest

from accounts.roles import Role
from tests.web.test_console_pages import flash, login

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("value", ["abc", "", "-1", "0", "1e3", str(2**70), "9" * 40])
def test_switching_tenant_with_an_unreadable_id_is_refused_not_a_500(
    client, tenant, make_member, value
):
    login(client, make_member(tenant))
    response = client.post("/tenant/switch/", {"tenant": value})
    assert response.status_code == 302
    assert "not a member" in flash(response)
    assert b"Acme AI" in client.get("/").content


@pytest.mark.parametrize(
    "referer",
    [
        "https://evil.example/phish",
        "//evil.example/phish",
        "javascript:alert(1)",
        "http://testserver@evil.example/",
    ],
)
def test_a_refused_action_never_follows_a_foreign_referer(client, tenant, make_member, referer):
    login(client, make_member(tenant, Role.VIEWER))
    response = client.post("/members/", {"email": "x@example.com"}, HTTP_REFERER=referer)
    assert response.status_code == 302
    assert response["Location"] == "/"
    assert "cannot do this" in flash(response)


def test_a_refused_action_goes_back_to_a_page_of_this_site(client, tenant, make_member):
    login(client, make_member(tenant, Role.VIEWER))
    response = client.post(
        "/members/", {"email": "x@example.com"}, HTTP_REFERER="http://testserver/tokens/"
    )
    assert response["Location"] == "http://testserver/tokens/"


def _sign_in(client, username, password, **extra):
    return client.post("/login/", {"username": username, "password": password}, **extra)


def test_wrong_passwords_lock_the_account_even_for_the_right_one(client, tenant, make_member):
    make_member(tenant, username="erin")
    for _ in range(4):
        assert _sign_in(client, "erin", "wrong").status_code == 200
    assert _sign_in(client, "erin", "wrong").status_code == 429  # the fifth locks
    locked = _sign_in(client, "erin", "correct-horse-battery")
    assert locked.status_code == 429
    assert int(locked["Retry-After"]) == 15 * 60
    assert b"Too many failed sign-ins" in locked.content
    assert client.get("/").status_code == 302  # still signed out


def test_guessing_many_usernames_from_one_address_is_locked(client, tenant, make_member):
    make_member(tenant, username="erin")
    for n in range(5):
        _sign_in(client, f"nobody-{n}", "wrong")
    locked = _sign_in(client, "erin", "correct-horse-battery", HTTP_ACCEPT="application/json")
    assert locked.status_code == 429
    assert locked.json()["code"] == "too_many_attempts"
    assert "Retry-After" in locked


def test_another_address_still_signs_in_to_another_account(client, tenant, make_member):
    make_member(tenant, username="erin")
    for n in range(5):
        _sign_in(client, f"nobody-{n}", "wrong")
    elsewhere = _sign_in(client, "erin", "correct-horse-battery", REMOTE_ADDR="10.0.0.9")
    assert elsewhere.status_code == 302


def test_a_good_sign_in_clears_the_count(client, tenant, make_member):
    make_member(tenant, username="erin")
    for _ in range(4):
        _sign_in(client, "erin", "wrong")
    assert _sign_in(client, "erin", "correct-horse-battery").status_code == 302
    client.logout()
    for _ in range(4):
        _sign_in(client, "erin", "wrong")
    assert _sign_in(client, "erin", "correct-horse-battery").status_code == 302


def test_the_admin_login_is_locked_too(client, db):
    from tests.factories import UserFactory

    UserFactory(username="op", is_staff=True, is_superuser=True)
    for _ in range(5):
        client.post("/admin/login/", {"username": "op", "password": "wrong"})
    locked = client.post("/admin/login/", {"username": "op", "password": "correct-horse-battery"})
    assert locked.status_code == 429
    assert client.get("/admin/").status_code == 302


def test_guessing_api_tokens_is_throttled_per_address(tenant, make_member, token_client):
    from rest_framework.test import APIClient

    good = token_client(make_member(tenant))
    guesser = APIClient()
    for n in range(10):
        guesser.credentials(HTTP_AUTHORIZATION=f"Bearer gpc_{n:08d}_guess")
        assert guesser.get("/api/v1/quota/").status_code == 401
    refused = guesser.get("/api/v1/quota/")
    assert refused.status_code == 429
    assert refused.json()["code"] == "throttled"
    assert 0 < int(refused["Retry-After"]) <= 60
    # the throttle is per address: the same address with a good token is refused too, another
    # address is not
    assert good.get("/api/v1/quota/").status_code == 429
    assert good.get("/api/v1/quota/", REMOTE_ADDR="10.0.0.9").status_code == 200
