"""The console's Notifications pages (admins and owners): the tenant's endpoints, adding one,
and each endpoint's page (its kinds, a test, secret rotation, its delivery log)."""

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from accounts.guards import tenant_view
from accounts.roles import MANAGE
from console.audit import pages
from console.errors import DomainError
from console.notifications import services
from console.notifications.forms import EndpointEditForm, EndpointForm
from console.notifications.models import Attempt, Endpoint

NEW_SECRET_KEY = "new_webhook_secret"  # noqa: S105 - a session key, not a secret
LOG_SHOWN = 50


def _add_errors(form, error: ValidationError) -> None:
    for field, errors in error.message_dict.items():
        form.add_error(field if field in form.fields else None, errors)


def _endpoint(request, pk) -> Endpoint:
    return get_object_or_404(Endpoint, pk=pk, tenant=request.membership.tenant)


@tenant_view(MANAGE)
def endpoints(request):
    form = EndpointForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            endpoint, secret = services.create_endpoint(
                request.membership.tenant, **form.cleaned_data
            )
        except ValidationError as error:
            _add_errors(form, error)
        else:
            messages.success(request, f"Endpoint {endpoint.name} added.")
            if secret:
                request.session[NEW_SECRET_KEY] = {"endpoint": endpoint.pk, "secret": secret}
            return redirect("notifications:endpoint", pk=endpoint.pk)
    listed = Endpoint.objects.filter(tenant=request.membership.tenant)
    return render(request, "notifications/endpoints.html", {"form": form, "endpoints": listed})


@tenant_view(MANAGE)
def endpoint(request, pk):
    found = _endpoint(request, pk)
    initial = {name: getattr(found, name) for name in ("name", "target", "kinds", "enabled")}
    form = EndpointEditForm(request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid():
        try:
            services.update_endpoint(found, **form.cleaned_data)
        except ValidationError as error:
            _add_errors(form, error)
        else:
            messages.success(request, f"Endpoint {found.name} saved.")
            return redirect("notifications:endpoint", pk=found.pk)
    shown = request.session.pop(NEW_SECRET_KEY, None)
    secret = shown["secret"] if shown and shown["endpoint"] == found.pk else None
    log = Attempt.objects.filter(endpoint=found).select_related("delivery__notice")[:LOG_SHOWN]
    return render(
        request,
        "notifications/endpoint.html",
        {"endpoint": found, "form": form, "secret": secret, "log": log},
    )


@require_POST
@tenant_view(MANAGE)
def endpoint_test(request, pk):
    found = _endpoint(request, pk)
    services.send_test(found)
    messages.success(request, "A test notice is on its way; its outcome shows in the log below.")
    return redirect("notifications:endpoint", pk=found.pk)


@require_POST
@tenant_view(MANAGE)
def endpoint_rotate(request, pk):
    found = _endpoint(request, pk)
    try:
        secret = services.rotate_secret(found)
    except DomainError as error:
        pages.refused(request, error.code, error.detail)
        messages.error(request, error.detail)
    else:
        request.session[NEW_SECRET_KEY] = {"endpoint": found.pk, "secret": secret}
        messages.success(
            request,
            f"New secret made; the old one keeps signing too until "
            f"{found.previous_secret_expires_at:%Y-%m-%d %H:%M} UTC.",
        )
    return redirect("notifications:endpoint", pk=found.pk)


@require_POST
@tenant_view(MANAGE)
def endpoint_delete(request, pk):
    found = _endpoint(request, pk)
    services.delete_endpoint(found)
    messages.success(request, f"Endpoint {found.name} deleted.")
    return redirect("notifications:endpoints")
