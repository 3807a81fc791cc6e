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
    response = client.post("/tokens/", {"name": "x"}, HTTP_REFERER=referer)
    assert response.status_code == 302
    assert response["Location"] == "/"
    assert "cannot do this" in flash(response)


def test_a_refused_action_goes_back_to_a_page_of_this_site(client, tenant, make_member):
    login(client, make_member(tenant, Role.VIEWER))
    response = client.post("/tokens/", {"name": "x"}, HTTP_REFERER="http://testserver/members/")
    assert response["Location"] == "http://testserver/members/"
