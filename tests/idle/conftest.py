"""The idle policies' tests record only the names of the tasks services queue, and call the
API as a member, an admin or a viewer (the catalog is tests/conftest.py's)."""

import pytest

from accounts.roles import Role


@pytest.fixture
def no_tasks(monkeypatch):
    """Record the tasks services queue instead of sending them; answers the list."""
    from console.instances import queue

    sent = []
    monkeypatch.setattr(queue, "enqueue", lambda name, *args, countdown=None: sent.append(name))
    return sent


@pytest.fixture
def member_client(tenant, make_member, token_client):
    return token_client(make_member(tenant, Role.MEMBER))


@pytest.fixture
def admin_client(tenant, make_member, token_client):
    return token_client(make_member(tenant, Role.ADMIN))


@pytest.fixture
def viewer_client(tenant, make_member, token_client):
    return token_client(make_member(tenant, Role.VIEWER))
