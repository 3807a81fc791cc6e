"""DRF authentication: bearer API tokens and browser sessions, both bound to one tenant."""

from drf_spectacular.authentication import SessionScheme
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, SessionAuthentication
from rest_framework.throttling import BaseThrottle, SimpleRateThrottle

from accounts.services import TokenRejected, authenticate_token
from accounts.tenancy import session_membership
from console.errors import ErrorCode


class TenantSuspended(exceptions.PermissionDenied):
    default_code = ErrorCode.TENANT_SUSPENDED
    default_detail = "This tenant is suspended."


def client_address(request) -> str:
    """The client's address as DRF's throttles see it (NUM_PROXIES), for django-axes too."""
    return BaseThrottle().get_ident(request)


class BadTokenThrottle(SimpleRateThrottle):
    """Unknown or malformed bearer tokens per client address (DEFAULT_THROTTLE_RATES
    "bad_token"): past the rate, every bearer request from that address is refused (429 with
    Retry-After) before any token is looked up, so tokens cannot be guessed."""

    scope = "bad_token"

    def get_cache_key(self, request, view):
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}

    def refuses(self, request) -> bool:
        """Whether the address is at its limit now; records nothing (allow_request records)."""
        self.key = self.get_cache_key(request, None)
        self.now = self.timer()
        self.history = [t for t in self.cache.get(self.key, []) if t > self.now - self.duration]
        return len(self.history) >= self.num_requests


class BearerTokenAuthentication(BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None
        keyword, _, raw = header.partition(" ")
        if keyword != self.keyword:
            return None
        throttle = BadTokenThrottle()
        if throttle.refuses(request):
            raise exceptions.Throttled(
                throttle.wait(), detail="Too many unknown API tokens from your address."
            )
        if not raw.strip():
            throttle.allow_request(request, None)
            raise exceptions.AuthenticationFailed(
                "Empty bearer token.", code=ErrorCode.INVALID_TOKEN
            )
        try:
            token, membership = authenticate_token(raw.strip())
        except TokenRejected as rejected:
            if rejected.code == ErrorCode.TENANT_SUSPENDED:
                raise TenantSuspended(rejected.detail) from None
            if rejected.code == ErrorCode.INVALID_TOKEN:
                throttle.allow_request(request, None)  # counts one more guess
            raise exceptions.AuthenticationFailed(rejected.detail, code=rejected.code) from None
        request._request.membership = membership
        request._request.api_token = token  # the audit log's actor (console.audit.context)
        return token.user, token

    def authenticate_header(self, request):
        return self.keyword


class TenantSessionAuthentication(SessionAuthentication):
    def authenticate(self, request):
        result = super().authenticate(request)
        if result is None:
            return None
        membership = session_membership(request._request)
        if membership is not None and not membership.tenant.is_active:
            raise TenantSuspended(f"Tenant {membership.tenant.slug} is suspended.")
        request._request.membership = membership
        return result


class BearerTokenScheme(OpenApiAuthenticationExtension):
    """How the OpenAPI document describes API tokens."""

    target_class = BearerTokenAuthentication
    name = "apiToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API token (gpc_…) from the console's API tokens page; it acts "
            "for one user in one tenant.",
        }


class TenantSessionScheme(SessionScheme):
    target_class = TenantSessionAuthentication
