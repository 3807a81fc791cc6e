from rest_framework import exceptions
from rest_framework.permissions import SAFE_METHODS, BasePermission

from accounts.roles import OPERATE, READ


def request_membership(request):
    """The membership an API request acts as (token or session), or None."""
    return getattr(request._request, "membership", None) or None


class TenantRole(BasePermission):
    """Signed in, a member of the tenant, and at least the role the view asks for.

    Views name their needs with `read_role` (safe methods) and `write_role` (the rest);
    the defaults let viewers read and members change things."""

    def has_permission(self, request, view):
        if not request.user or not request.user.is_authenticated:
            return False
        membership = request_membership(request)
        if membership is None:
            raise exceptions.PermissionDenied(
                "You are not a member of any tenant.", code="no_tenant"
            )
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
            raise exceptions.PermissionDenied(detail, code="permission_denied")
        return True
