"""Websocket authentication: a browser session or `Authorization: Bearer <token>` on the
handshake. Sets scope["user"], scope["membership"] (None when neither identifies a member) and,
for a token, scope["api_token_id"] so that long-lived sockets can check it still stands."""

import time

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async

from accounts.models import Membership
from accounts.roles import READ
from accounts.services import TokenRejected, access_stands, authenticate_token
from accounts.tenancy import chosen_membership

# How often an open tenant socket checks that its membership (and token) still stand.
RECHECK_SECONDS = 30.0

_access_stands = database_sync_to_async(access_stands)


@database_sync_to_async
def _from_token(raw: str):
    try:
        token, membership = authenticate_token(raw)
    except TokenRejected:
        return None, None, None
    return token.user, membership, token.pk


@database_sync_to_async
def _from_session(scope):
    membership = chosen_membership(scope.get("user"), scope.get("session"))
    if membership is not None and not membership.tenant.is_active:
        return None
    return membership


class _BearerOrSession:
    def __init__(self, inner):
        self.inner = inner

    async def __call__(self, scope, receive, send):
        headers = dict(scope.get("headers", []))
        auth = headers.get(b"authorization", b"").decode("latin-1")
        if auth.startswith("Bearer "):
            user, membership, token_id = await _from_token(auth[len("Bearer ") :].strip())
            scope = {**scope, "membership": membership, "api_token_id": token_id}
            if user is not None:
                scope["user"] = user
        else:
            scope = {**scope, "membership": await _from_session(scope)}
        return await self.inner(scope, receive, send)


def TenantAuthMiddleware(inner):  # noqa: N802 - reads like the middleware class it builds
    return AuthMiddlewareStack(_BearerOrSession(inner))


def reading_member(scope) -> Membership | None:
    """The socket's membership when it may read its tenant's things (an active tenant)."""
    membership = scope.get("membership")
    if membership is None or not membership.can(READ) or not membership.tenant.is_active:
        return None
    return membership


class StandingAccess:
    """Whether the access an open socket was granted at its handshake still holds: its
    membership is there, its tenant active, its API token (if any) neither revoked nor
    expired. Looked up at most every RECHECK_SECONDS, when the socket has something to send."""

    def __init__(self, scope):
        self.membership_id = scope["membership"].pk
        self.token_id = scope.get("api_token_id")
        self.checked_at = time.monotonic()

    async def holds(self) -> bool:
        if time.monotonic() - self.checked_at < RECHECK_SECONDS:
            return True
        self.checked_at = time.monotonic()
        return await _access_stands(self.membership_id, self.token_id)
