"""Fixtures of the template tests: the instance tests' catalog, members of each role, and the
tasks recorded instead of sent."""

import pytest

from accounts.roles import Role
from tests.instances.conftest import Catalog, no_tasks  # noqa: F401 - a fixture of these tests


@pytest.fixture
def catalog(db):
    return Catalog()


@pytest.fixture
def member(tenant, make_member):
    return make_member(tenant, Role.MEMBER, username="mia")


@pytest.fixture
def viewer(tenant, make_member):
    return make_member(tenant, Role.VIEWER, username="vic")
