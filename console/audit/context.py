"""Who is acting now: the person of the request being served (set by AuditActorMiddleware;
an API token request's user and token once DRF has authenticated it), an actor named with
``acting_as`` (management commands, tests), or else the system (Celery tasks, beat)."""

import ipaddress
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from django.contrib.auth.base_user import AbstractBaseUser
from rest_framework.throttling import BaseThrottle

from console.audit.models import SYSTEM


@dataclass(frozen=True)
class Actor:
    user: object = None  # an authenticated user, or None for the system
    token: object = None  # the accounts.ApiToken the user acts with, if any
    address: str | None = None

    @property
    def is_person(self) -> bool:
        return self.user is not None

    @property
    def label(self) -> str:
        if self.user is None:
            return SYSTEM
        if self.token is None:
            return self.user.get_username()
        return f"{self.user.get_username()} (token {self.token.name}, gpc_{self.token.prefix}_…)"


THE_SYSTEM = Actor()

_request: ContextVar = ContextVar("audit_request", default=None)
_named: ContextVar[Actor | None] = ContextVar("audit_actor", default=None)


def client_address(request) -> str | None:
    """REMOTE_ADDR, or behind TRUSTED_PROXY_COUNT proxies (DRF's NUM_PROXIES) the address
    they put in X-Forwarded-For, as the throttles and django-axes see it; None when it is
    not an IP address."""
    ident = BaseThrottle().get_ident(request)
    try:
        return str(ipaddress.ip_address((ident or "").strip()))
    except ValueError:
        return None


def current() -> Actor:
    named = _named.get()
    if named is not None:
        return named
    request = _request.get()
    if request is None:
        return THE_SYSTEM
    user = getattr(request, "user", None)
    # a person signed in (or holding a token); a host agent's request is not a person's
    if not isinstance(user, AbstractBaseUser) or not user.is_authenticated:
        return THE_SYSTEM
    # accounts.authentication.BearerTokenAuthentication leaves the token on the request
    return Actor(user, getattr(request, "api_token", None), client_address(request))


@contextmanager
def serving(request):
    """The request whose person acts while it is served."""
    reset = _request.set(request)
    try:
        yield
    finally:
        _request.reset(reset)


@contextmanager
def acting_as(user, token=None, address: str | None = None):
    """Name the actor of what runs inside (a management command run by an operator)."""
    reset = _named.set(Actor(user, token, address))
    try:
        yield
    finally:
        _named.reset(reset)
