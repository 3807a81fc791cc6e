"""Fixtures of the notification tests (the webhook receiver is tests/conftest.py's)."""

import pytest


@pytest.fixture
def private_allowed(settings):
    """As tests and `make run` are: loopback receivers and plain http allowed."""
    settings.NOTIFICATIONS_ALLOW_PRIVATE_ADDRESSES = True
    return settings
