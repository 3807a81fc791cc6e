"""Fixtures of the volume tests: an API client of the member (the catalog, members of each role
and the tasks recorded instead of sent are tests/conftest.py's)."""

import pytest


@pytest.fixture
def client(member, token_client):
    return token_client(member)
