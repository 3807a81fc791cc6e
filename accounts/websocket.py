"""Websocket authentication: a browser session (from an allowed Origin) or `Authorization:
Bearer <token>` (with or without an Origin) on the handshake. Sets scope["user"],
scope["membership"] (None when neither identifies a member) and, for a token,
scope["api_token_id"] so that long-lived sockets can check it still stands."""

import random
import time

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.security.websocket import AllowedHostsOriginValidator

from accounts import scopes
from accounts.models import Membership
from accounts.roles import READ
from accounts.services import TokenRejected, access_stands, authenticate_token, operator_stands
from accounts.tenancy import chosen_membership

# How often an open tenant socket checks that its membership (and token) still stand.
RECHECK_SECONDS = 30.0

_access_stands = database_sync_to_async(access_stands)
_operator_stands = database_sync_to_async(operator_stands)


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


def _bearer(scope) -> str | None:
    auth = dict(scope.get("headers", [])).get(b"authorization", b"").decode("latin-1")
    return auth[len("Bearer ") :].strip() if auth.startswith("Bearer ") else None


class _BearerOrSession:
    def __init__(self, inner):
        self.inner = inner

    async def __call__(self, scope, receive, send):
        raw = _bearer(scope)
        if raw is not None:
            user, membership, token_id = await _from_token(raw)
            scope = {**scope, "membership": membership, "api_token_id": token_id}
            if user is not None:
                scope["user"] = user
        else:
            scope = {**scope, "membership": await _from_session(scope)}
        return await self.inner(scope, receive, send)


class _OriginUnlessBearer:
    """The Origin check guards cookie sessions against cross-site websocket hijacking. A
    handshake with `Authorization: Bearer` never uses the session (a browser cannot set that
    header on a websocket), so scripts and CLIs, which send no Origin, are let through."""

    def __init__(self, inner):
        self.inner = inner
        self.origin_checked = AllowedHostsOriginValidator(inner)

    async def __call__(self, scope, receive, send):
        if _bearer(scope) is not None:
            return await self.inner(scope, receive, send)
        return await self.origin_checked(scope, receive, send)


def TenantAuthMiddleware(inner):  # noqa: N802 - reads like the middleware class it builds
    return _OriginUnlessBearer(AuthMiddlewareStack(_BearerOrSession(inner)))


def reading_member(scope, needs: str | None = None, *, whole_tenant=True) -> Membership | None:
    """The socket's membership when it may read its tenant's things (an active tenant) and
    its API token, if any, holds the scope `needs` (a scoped token gets nothing that names
    none) and, for a stream of every instance of the tenant (`whole_tenant`), is confined to
    no name prefix. A socket about one instance passes whole_tenant=False and checks that
    instance against scopes.covers_instance."""
    membership = scope.get("membership")
    if membership is None or not membership.can(READ) or not membership.tenant.is_active:
        return None
    token = scopes.token_of(membership)
    if token is not None:
        if token.is_scoped and (needs is None or not scopes.grants(token.scopes, needs)):
            return None
        if whole_tenant and token.instance_prefix:
            return None
    return membership


class _Standing:
    """Whether what an open socket was granted at its handshake still holds, looked up when the
    socket has something to send and its last look is older than its own part of
    RECHECK_SECONDS: 3/4 of it or more, drawn once a socket. Sockets opened together (a page's
    viewers after a console restart) would otherwise look together for good: 250 lookups at
    once, each a database query in the one thread of database_sync_to_async, held a server's
    live frames back ~0.8 s every 30 s (bench/metrics.py at 10,000 GPUs)."""

    def __init__(self):
        self.checked_at = time.monotonic()
        self.part = random.uniform(0.75, 1.0)  # noqa: S311 - a spread, not a secret

    async def holds(self) -> bool:
        if time.monotonic() - self.checked_at < RECHECK_SECONDS * self.part:
            return True
        self.checked_at = time.monotonic()
        return await self.stands()

    async def stands(self) -> bool:
        raise NotImplementedError


class StandingAccess(_Standing):
    """A tenant socket: its user active, its membership there, its tenant active, its API
    token (if any) neither revoked nor expired."""

    def __init__(self, scope):
        super().__init__()
        self.membership_id = scope["membership"].pk
        self.token_id = scope.get("api_token_id")

    async def stands(self) -> bool:
        return await _access_stands(self.membership_id, self.token_id)


def is_operator(user) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_active and user.is_staff)


def operator_socket(scope) -> bool:
    """Whether the socket is an operator's: a scoped or prefix-confined API token opens no
    operator's stream, whoever its user is."""
    token = scopes.token_of(scope.get("membership"))
    if token is not None and (token.is_scoped or token.instance_prefix):
        return False
    return is_operator(scope.get("user"))


class StandingOperator(_Standing):
    """An operator's socket: its user still active and staff."""

    def __init__(self, scope):
        super().__init__()
        self.user_id = scope["user"].pk

    async def stands(self) -> bool:
        return await _operator_stands(self.user_id)
