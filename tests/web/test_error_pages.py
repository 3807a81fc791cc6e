"""Error pages in the console's layout, each with a way back; operators without a tenant
land on the fleet and are not offered tenant pages."""

import pytest
from django.test import Client, RequestFactory

from accounts.roles import Role
from console.api.errors import api_server_error
from tests.factories import UserFactory
from tests.web.test_console_pages import flash, login

pytestmark = pytest.mark.django_db


def test_a_missing_page_is_a_styled_404_with_the_menu_and_a_way_back(client, tenant, make_member):
    login(client, make_member(tenant, Role.MEMBER))
    response = client.get("/no-such-page/")
    assert response.status_code == 404
    html = response.content.decode()
    assert 'data-testid="error-page"' in html and "Page not found" in html
    assert 'class="sidebar"' in html and 'href="/billing/usage/"' in html  # the console's layout
    assert 'href="/" data-testid="error-home">Back to the dashboard' in html


def test_another_tenants_instance_is_the_same_styled_404(client, tenant, other_tenant, make_member):
    from tests.billing.conftest import World

    theirs = World().instance(other_tenant, name="secret")
    login(client, make_member(tenant, Role.OWNER))
    response = client.get(f"/instances/{theirs.pk}/")
    assert response.status_code == 404
    assert "Page not found" in response.content.decode()
    assert "secret" not in response.content.decode()


def test_anonymous_404_offers_sign_in(client):
    response = client.get("/no-such-page/")
    assert response.status_code == 404
    html = response.content.decode()
    assert "Page not found" in html and 'href="/login/"' in html and "css/console" in html


def test_the_api_still_answers_json_404(client):
    response = client.get("/api/v1/no-such-thing/")
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


def test_403_is_styled_with_a_way_back(client):
    client.force_login(UserFactory(is_staff=True))  # staff, but no permission on invoices
    response = client.get("/admin/billing/invoice/")
    assert response.status_code == 403
    html = response.content.decode()
    assert "Not allowed" in html and "Back to the fleet" in html and 'class="sidebar"' in html


def test_an_expired_form_is_a_styled_403(tenant, make_member):
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_member(tenant, Role.OWNER).user)
    response = client.post("/tenant/switch/", {"tenant": tenant.pk})
    assert response.status_code == 403
    html = response.content.decode()
    assert "This form has expired" in html and "Nothing was changed" in html
    assert 'data-testid="error-home"' in html


def test_500_is_styled_and_needs_no_database():
    response = api_server_error(RequestFactory().get("/instances/"))
    assert response.status_code == 500
    html = response.content.decode()
    assert "Something went wrong on our side" in html and "css/console" in html
    assert 'href="/"' in html


def test_an_operator_without_a_tenant_lands_on_the_fleet(client):
    operator = UserFactory(username="ops", is_staff=True)
    response = client.post("/login/", {"username": "ops", "password": "correct-horse-battery"})
    assert client.get(response["Location"])["Location"] == "/fleet/"
    fleet = client.get("/fleet/").content.decode()
    assert 'href="/fleet/"' in fleet
    for tenant_page in ("/instances/", "/billing/usage/", "/billing/invoices/", "/members/",
                        "/tokens/", "/ssh-keys/"):  # fmt: skip
        assert f'href="{tenant_page}"' not in fleet, tenant_page
    response = client.get("/billing/usage/")
    assert response["Location"] == "/fleet/"
    assert "You belong to no tenant" in flash(response)
    assert operator.is_staff


def test_a_user_without_a_tenant_still_gets_the_no_tenant_page(client):
    client.force_login(UserFactory(email="new@example.com"))
    response = client.get("/")
    assert response.status_code == 403
    html = response.content.decode()
    assert "No tenant yet" in html and "new@example.com" in html
    assert 'href="/billing/usage/"' not in html
