from rest_framework import exceptions
from rest_framework.permissions import SAFE_METHODS, BasePermission

from accounts import scopes
from accounts.roles import OPERATE, READ
from console.errors import ErrorCode


class ScopeMissing(exceptions.PermissionDenied):
    """A scoped API token asked for what its scopes do not hold: 403, naming the scope."""

    default_code = ErrorCode.SCOPE_MISSING

    def __init__(self, needed: str | None):
        if needed is None:
            detail = "This endpoint names no scope: only an unscoped API token can use it."
        else:
            detail = scopes.missing_detail(needed)
        super().__init__(detail)
        self.extra = {"required_scope": needed}


def request_membership(request):
    """The membership an API request acts as (token or session), or None."""
    return getattr(request._request, "membership", None) or None


class PrefixConfined(exceptions.PermissionDenied):
    default_code = ErrorCode.PREFIX_CONFINED


def _check_token(token, needed: str | None) -> None:
    """A scoped token holds the scope `needed`; a prefix-confined one never gets what shows
    every instance of the tenant (nor an endpoint that names no scope)."""
    if token.is_scoped and (needed is None or not scopes.grants(token.scopes, needed)):
        raise ScopeMissing(needed)
    scope = scopes.BY_NAME.get(needed)
    if token.instance_prefix and (scope is None or scope.whole_tenant):
        raise PrefixConfined(scopes.confined_detail(token.instance_prefix))


class TenantRole(BasePermission):
    """Signed in, a member of the tenant, and at least the role the view asks for.

    Views name their needs with `read_role` (safe methods) and `write_role` (the rest);
    the defaults let viewers read and members change things. A scoped API token must also
    hold the scope the view names for the action (`api_scopes`, accounts.scopes)."""

    def has_permission(self, request, view):
        if not request.user or not request.user.is_authenticated:
            return False
        membership = request_membership(request)
        if membership is None:
            raise exceptions.PermissionDenied(
                "You are not a member of any tenant.", code=ErrorCode.NO_TENANT
            )
        token = scopes.token_of(membership)
        if token is not None and request.method != "OPTIONS":
            _check_token(token, scopes.required(view, request.method))
        if request.method in SAFE_METHODS:
            needed = getattr(view, "read_role", READ)
        else:
            needed = getattr(view, "write_role", OPERATE)
        if not membership.can(needed):
            if getattr(request.auth, "read_only", False):
                detail = "This API token is read-only; it acts as a viewer, who cannot do this."
            else:
                detail = (
                    f"Your role ({membership.role}) cannot do this; it needs {needed} or above."
                )
            raise exceptions.PermissionDenied(detail, code=ErrorCode.PERMISSION_DENIED)
        return True
