"""The console's pages as a browser client of the tests sees them."""

from django.test import Client


def signed_in(membership, **defaults) -> Client:
    """A browser client signed in as the membership's user (`defaults`: Client's, such as
    REMOTE_ADDR)."""
    client = Client(**defaults)
    client.force_login(membership.user)
    return client
