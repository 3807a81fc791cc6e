"""The operators' fleet page: hosts, GPUs, slices in use, and what operators do to them."""

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.db.models import Prefetch
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import Resolver404, resolve, reverse
from django.views.decorators.http import require_http_methods, require_POST

from accounts.guards import staff_view
from console.catalog.models import MIG_SLICES, Mode
from console.fleet import holders, identity, images, services
from console.fleet.forms import GpuModeForm, HostAddressForm, HostStatusForm, JoinTokenForm
from console.fleet.models import Gpu, Host, JoinToken

# The button of each status an operator may choose, in this order.
LABELS = {
    Host.Status.ACTIVE: "Activate",
    Host.Status.CORDONED: "Cordon",
    Host.Status.DRAINING: "Drain",
    Host.Status.MAINTENANCE: "Maintenance",
    Host.Status.RETIRED: "Retire",
}


def host_actions(host: Host) -> list[tuple[str, str, bool, bool]]:
    """(target status, label, danger, confirmed on a page of its own) of each move
    Host.TRANSITIONS allows from where it is."""
    return [
        (
            status,
            "Uncordon" if (host.admin_status, status) == ("cordoned", "active") else label,
            status == Host.Status.RETIRED,
            status in Host.ANNOUNCED,
        )
        for status, label in LABELS.items()
        if host.can_become(status)
    ]


def _error_text(error: ValidationError) -> str:
    return " ".join(error.messages)


def _gpus() -> Prefetch:
    """A host's GPUs with their usage and who holds them (holders.attach reads these)."""
    return Prefetch(
        "gpus",
        queryset=Gpu.with_usage().order_by("index").prefetch_related(holders.claims()),
    )


def _hosts():
    return (
        Host.objects.select_related("region")
        .prefetch_related(_gpus(), "images")
        .order_by("region__code", "name")
    )


def _summary(hosts: list[Host]) -> dict:
    gpus = [gpu for host in hosts if host.status != Host.Status.RETIRED for gpu in host.gpus.all()]
    by_mode = {mode: [g for g in gpus if g.mode == mode] for mode in Mode.values}
    return {
        "hosts": len([h for h in hosts if h.status != Host.Status.RETIRED]),
        "unreachable": len([h for h in hosts if h.status == Host.Status.UNREACHABLE]),
        "gpus": len(gpus),
        "unhealthy": len([g for g in gpus if not g.healthy]),
        "whole_used": len([g for g in by_mode[Mode.WHOLE] if g.claim_count]),
        "whole_total": len(by_mode[Mode.WHOLE]),
        "mig_used": sum(g.slot_count for g in by_mode[Mode.MIG]),
        "mig_total": MIG_SLICES * len(by_mode[Mode.MIG]),
        "shared_used": sum(g.milli_used or 0 for g in by_mode[Mode.SHARED]) / 1000,
        "shared_total": len(by_mode[Mode.SHARED]),
    }


def _index(request, issued=None, form=None, status=200):
    hosts = list(_hosts())
    for host in hosts:
        host.actions = host_actions(host)
        holders.attach(host)
        images.describe(host)
    tokens = JoinToken.objects.select_related("region", "host", "created_by")[:10]
    context = {
        "hosts": hosts,
        "summary": _summary(hosts),
        "tokens": tokens,
        "form": form or JoinTokenForm(),
        "issued": issued,
        "modes": Mode.choices,
        "back_url": reverse("fleet:index"),
        "waiting": holders.waiting(),
    }
    return render(request, "fleet/index.html", context, status=status)


@staff_view
def index(request):
    return _index(request)


@staff_view
def host_detail(request, pk):
    return _host_page(request, pk)


def _host_page(request, pk, address_form: HostAddressForm | None = None, status: int = 200):
    host = get_object_or_404(
        Host.objects.select_related("region").prefetch_related(_gpus(), "images"), pk=pk
    )
    host.actions = host_actions(host)
    holders.attach(host)
    images.describe(host)
    return render(
        request,
        "fleet/host.html",
        {
            "host": host,
            "events": host.events.select_related("actor")[:30],
            "join_token": JoinToken.objects.filter(host=host).first(),
            "modes": Mode.choices,
            "back_url": reverse("fleet:host", args=[host.pk]),
            "waiting": holders.waiting(host),
            "address_form": address_form or HostAddressForm(initial={"address": host.address}),
        },
        status=status,
    )


@require_POST
@staff_view
def host_secret(request, pk, revoke: bool):
    """Rotate the host's secret (the old one works a grace period more), or revoke it (it
    stops working at once): the agent gets the new one at the host's address."""
    host = get_object_or_404(Host, pk=pk)
    try:
        identity.rotate_secret(host, request.user, revoke=revoke)
    except ValidationError as error:
        messages.error(request, _error_text(error))
    else:
        old = "no longer works" if revoke else "works for a few minutes more"
        messages.success(request, f"{host.name}'s agent has its new secret; the old one {old}.")
    return redirect("fleet:host", pk=host.pk)


@require_POST
@staff_view
def host_address(request, pk):
    """The operator moves the host: the console calls its agent there from now on. A refused
    address is shown on the page, at its field (400)."""
    host = get_object_or_404(Host, pk=pk)
    form = HostAddressForm(request.POST)
    if form.is_valid():
        try:
            host = identity.change_address(host, form.cleaned_data["address"], request.user)
        except ValidationError as error:
            form.add_error(None, error)
    if not form.is_valid():
        return _host_page(request, pk, form, status=400)
    messages.success(request, f"The console calls {host.name}'s agent at {host.address}.")
    return redirect("fleet:host", pk=host.pk)


def _page(target: str) -> str:
    """`target` when it is the fleet page or a host's page, else the fleet page."""
    try:
        match = resolve(target)
    except Resolver404:
        match = None
    if match is not None and match.view_name in ("fleet:index", "fleet:host"):
        return target
    return reverse("fleet:index")


def _back(request):
    """Back to the page the button was on: the fleet page or a host's page."""
    return redirect(_page(request.POST.get("next", "")))


@require_http_methods(["GET", "POST"])
@staff_view
def host_status(request, pk):
    """GET: the confirmation page of a drain or maintenance, with the note for the tenants;
    POST: the change."""
    host = get_object_or_404(Host, pk=pk)
    form = HostStatusForm(request.POST if request.method == "POST" else request.GET)
    if not form.is_valid():
        messages.error(request, "Unknown status.")
        return _back(request)
    status = form.cleaned_data["status"]
    if request.method == "GET" and status not in Host.ANNOUNCED:
        return redirect("fleet:index")  # only these are asked on a page of their own
    if request.method == "GET":
        context = {
            "host": host,
            "status": status,
            "label": LABELS[status],
            "form": form,
            "instances": host.allocations.filter(released_at__isnull=True)
            .values("instance_id")
            .distinct()
            .count(),
            "back_url": _page(request.GET.get("next", "")),
        }
        return render(request, "fleet/host_status_confirm.html", context)
    try:
        host = services.set_host_status(
            host, status, actor=request.user, note=form.cleaned_data["note"]
        )
    except ValidationError as error:
        messages.error(request, _error_text(error))
    else:
        note = (
            " (it takes effect when the host is back)" if host.status != host.admin_status else ""
        )
        messages.success(request, f"{host.name} is now {host.admin_status}{note}.")
    return _back(request)


@require_POST
@staff_view
def host_images_clean_up(request, pk):
    """Queue the host's image clean-up; its outcome is one of the host's events."""
    host = get_object_or_404(Host, pk=pk)
    try:
        images.queue_clean_up(host, request.user)
    except ValueError as error:
        messages.error(request, str(error))
    else:
        messages.success(
            request, f"{host.name}'s image clean-up is queued: its events will say what went."
        )
    return redirect("fleet:host", pk=host.pk)


@require_POST
@staff_view
def gpu_mode(request, pk):
    gpu = get_object_or_404(Gpu.objects.select_related("host"), pk=pk)
    form = GpuModeForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Unknown mode.")
        return _back(request)
    try:
        gpu = services.set_gpu_mode(gpu, form.cleaned_data["mode"], actor=request.user)
    except ValidationError as error:
        messages.error(request, _error_text(error))
    else:
        messages.success(request, f"{gpu} is now in {gpu.get_mode_display().lower()} mode.")
    return _back(request)


@require_POST
@staff_view
def join_token_create(request):
    form = JoinTokenForm(request.POST)
    if not form.is_valid():
        return _index(request, form=form, status=400)
    try:
        token, raw = services.create_join_token(
            form.cleaned_data["region"],
            note=form.cleaned_data["note"],
            created_by=request.user,
            ttl_hours=form.cleaned_data["ttl_hours"],
        )
    except ValidationError as error:
        messages.error(request, _error_text(error))
        return redirect("fleet:index")
    # Rendered, not redirected: the raw token is never stored, not even in a message.
    server = request.build_absolute_uri("/").rstrip("/")  # the console as the operator reaches it
    return _index(
        request,
        issued={"token": token, "raw": raw, "command": form.command(server, raw)},
        form=form,
    )


@require_POST
@staff_view
def join_token_revoke(request, pk):
    token = services.revoke_join_token(get_object_or_404(JoinToken, pk=pk))
    messages.success(request, f"Join token {token.prefix}… is {token.state}.")
    return redirect("fleet:index")
