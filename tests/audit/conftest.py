"""Fixtures of the audit log tests: the instance tests' stack, an owner and an admin (the
member, the catalog and the task recorder are tests/conftest.py's), and clients signed in as
them (session) or holding their token."""

import pytest

from accounts.roles import Role
from tests.clients import signed_in as signed_in_as
from tests.instances.conftest import stack, stack_env  # noqa: F401 - fixtures

ADDRESS = "203.0.113.7"  # the client address every test client claims (REMOTE_ADDR)


@pytest.fixture
def owner(tenant, make_member):
    return make_member(tenant, Role.OWNER, username="olga")


@pytest.fixture
def admin(tenant, make_member):
    return make_member(tenant, Role.ADMIN, username="ada")


@pytest.fixture
def signed_in():
    """A browser client signed in as the membership's user, from ADDRESS."""

    def make(membership):
        return signed_in_as(membership, REMOTE_ADDR=ADDRESS)

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
