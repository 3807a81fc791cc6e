"""Guards for console pages, whatever app serves them: signed in, a member, an active tenant,
the right role; staff only; and the answer to a locked-out sign-in."""

from functools import wraps
from math import ceil

from axes.helpers import get_cool_off
from django.contrib import messages
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.views import redirect_to_login
from django.http import Http404, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme

from accounts.roles import READ
from console.audit import pages
from console.errors import ErrorCode


def tenant_view(needed: str = READ, write_needed: str | None = None):
    """Page guard. `needed` applies to every request, `write_needed` to POSTs as well.

    A role too low for a POST gets a message and goes back to the page, as the API's 403 would;
    that refusal and a POST's 404 (another tenant's object) are on the audit log's record."""

    def decorator(view):
        @wraps(view)
        def wrapper(request, *args, **kwargs):
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            membership = request.membership
            if not membership and request.user.is_staff:
                # An operator without a tenant has no tenant pages: the fleet is theirs.
                if request.path != reverse("dashboard"):
                    messages.info(request, "You belong to no tenant; this is the fleet.")
                return redirect("fleet:index")
            if not membership:
                return render(request, "web/no_tenant.html", status=403)
            if not membership.tenant.is_active:
                return render(request, "web/suspended.html", status=403)
            role = write_needed if request.method == "POST" and write_needed else needed
            if not membership.can(role):
                why = f"Your role ({membership.role}) cannot do this; it needs {role}."
                pages.refused(request, ErrorCode.PERMISSION_DENIED, why)
                messages.error(request, why)
                return redirect_back(request)
            try:
                return view(request, *args, **kwargs)
            except Http404:
                pages.refused(request, ErrorCode.NOT_FOUND, "Not found.")
                raise

        return wrapper

    return decorator


def redirect_back(request, fallback: str = "dashboard"):
    """Back to the page the request came from when that page is on this site, else `fallback`
    (a Referer naming another site is never followed)."""
    referer = request.META.get("HTTP_REFERER", "")
    if url_has_allowed_host_and_scheme(
        referer, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return redirect(referer)
    return redirect(fallback)


def login_locked_out(request, response=None, credentials=None):
    """django-axes' answer once sign-ins from this address or for this username are locked:
    429 with Retry-After, as the sign-in page (or JSON for a client that asks for it)."""
    retry_after = int(get_cool_off(request).total_seconds())
    detail = (
        f"Too many failed sign-ins. Try again in {ceil(retry_after / 60)} minutes, "
        "or ask an administrator."
    )
    if request.get_preferred_type(["text/html", "application/json"]) == "application/json":
        locked = JsonResponse({"code": ErrorCode.TOO_MANY_ATTEMPTS, "detail": detail}, status=429)
    else:
        context = {"form": AuthenticationForm(request), "locked": detail}
        locked = render(request, "accounts/login.html", context, status=429)
    locked["Retry-After"] = str(retry_after)
    return locked


def staff_view(view):
    """Operators only; to anyone else signed in, the page does not exist."""

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if not request.user.is_staff:
            raise Http404
        return view(request, *args, **kwargs)

    return wrapper
