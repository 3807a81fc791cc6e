import pytest

from tests.notifications.receiver import Receiver, serve


@pytest.fixture
def receiver():
    """A local webhook receiver (answers 200 unless its `statuses` say otherwise)."""
    found = Receiver()
    server, _ = serve(found)
    yield found
    server.shutdown()
    server.server_close()


@pytest.fixture
def private_allowed(settings):
    """As tests and `make run` are: loopback receivers and plain http allowed."""
    settings.NOTIFICATIONS_ALLOW_PRIVATE_ADDRESSES = True
    return settings
