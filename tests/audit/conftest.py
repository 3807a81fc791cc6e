"""Fixtures of the audit log tests: the instance tests' catalog and task recorder, tenants
with a member of each role, and clients signed in as them (session) or holding their
token."""

import pytest
from django.test import Client

from accounts.roles import Role
from tests.instances.conftest import Catalog, no_tasks, stack, stack_env  # noqa: F401 - fixtures

ADDRESS = "203.0.113.7"  # the client address every test client claims (REMOTE_ADDR)


@pytest.fixture
def catalog(db):
    return Catalog()


@pytest.fixture
def owner(tenant, make_member):
    return make_member(tenant, Role.OWNER, username="olga")


@pytest.fixture
def admin(tenant, make_member):
    return make_member(tenant, Role.ADMIN, username="ada")


@pytest.fixture
def member(tenant, make_member):
    return make_member(tenant, Role.MEMBER, username="mia")


@pytest.fixture
def signed_in():
    """A browser client signed in as the membership's user, from ADDRESS."""

    def make(membership):
        client = Client(REMOTE_ADDR=ADDRESS)
        client.force_login(membership.user)
        return client

    return make


@pytest.fixture
def api(token_client):
    """An API client holding a fresh token of the membership, from ADDRESS."""

    def make(membership):
        client = token_client(membership)
        client.defaults["REMOTE_ADDR"] = ADDRESS
        client.token = membership.user.api_tokens.get(name="test")
        return client

    return make
