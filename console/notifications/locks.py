"""Row locks of notification endpoints: taken alone, in a transaction that locks nothing else
(accounts/locks.py states the order of the others)."""

from console.notifications.models import Endpoint


def endpoint(pk: int) -> Endpoint:
    return Endpoint.objects.select_for_update().get(pk=pk)
