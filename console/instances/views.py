"""Console pages of instances: the list (live), the launch form, the detail page."""

import json
from decimal import Decimal

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.db.models import Prefetch
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from accounts.guards import tenant_view
from accounts.roles import OPERATE, READ
from console import integers
from console.audit import pages
from console.catalog.models import Image, Region, Spec
from console.errors import DomainError
from console.fleet.models import Host
from console.instances import (
    access,
    availability,
    image_choices,
    lifecycle,
    placement,
    resizing,
    restarts,
    services,
    sign_in,
)
from console.instances.forms import LaunchForm, ResizeForm, resize_options
from console.instances.models import Allocation, Instance, State
from console.instances.quota import usage
from console.launch_templates import services as template_services

HOURS_PER_MONTH = Decimal(730)
LIVE_FILTERS = {
    "live": "All but terminated",
    "running": "Running",
    "pending": "Queued",
    "stopped": "Stopped",
    "failed": "Failed",
    "terminated": "Terminated",
    "all": "All",
}


def _instances(request):
    return (
        Instance.objects.filter(tenant=request.membership.tenant)
        .select_related("spec__gpu_model", "spec__mig_profile", "image", "region")
        .prefetch_related("spec__prices")
    )


@tenant_view(READ)
def instance_list(request):
    shown = request.GET.get("state", "live")
    if shown not in LIVE_FILTERS:
        shown = "live"
    instances = _instances(request)
    if shown == "live":
        instances = instances.exclude(state=State.TERMINATED)
    elif shown != "all":
        instances = instances.filter(state=shown)
    page = Paginator(instances, 50).get_page(integers.reference_id(request.GET.get("page")))
    return render(
        request,
        "instances/list.html",
        {
            "page": page,
            "instances": page.object_list,
            "shown": shown,
            "filters": LIVE_FILTERS.items(),
            "can_operate": request.membership.can(OPERATE),
        },
    )


# How many of a spec the launch form counts as fitting now, at most ("64+").
FIT_COUNT_LIMIT = 64


def _fit_count(checker, spec, found) -> int:
    """How many of `spec` the region's free capacity holds now (only a spec that fits now
    is counted: the others hold none)."""
    if found.status != availability.FITS_NOW:
        return 0
    return placement.count_fits(spec, checker.now, FIT_COUNT_LIMIT)


def _spec_rows(checkers, specs, selected_region) -> list[dict]:
    """The launch form's specs (grouped by GPU model and mode, in the order given), each with
    what it does in each region (status, label, detail, how many fit now) and in the
    selected one, for the page as served. The regions are read once each (a Checker)."""
    rows = []
    for order, spec in enumerate(specs):
        found = {checker.region.code: (checker, checker.of(spec)) for checker in checkers}
        by_region = {
            code: [a.status, a.label, a.detail, _fit_count(checker, spec, a)]
            for code, (checker, a) in found.items()
        }
        now = by_region.get(selected_region)
        rows.append(
            {
                "spec": spec,
                "order": order,
                "group": f"{spec.gpu_model.name} · {spec.get_mode_display()}",
                "per_month": spec.current_price() * HOURS_PER_MONTH,
                "gpu_memory_gib": round(spec.gpu_memory_mib / 1024, 1),
                "ram_gib": round(spec.ram_mib / 1024, 1),
                "now": now and {"status": now[0], "label": now[1], "detail": now[2]},
                "fit_count": now[3] if now else 0,
                "launchable": now is not None
                and now[0] in (availability.FITS_NOW, availability.QUEUES),
                "availability": json.dumps(by_region),
            }
        )
    return rows


# Where the error summary of the launch form links to, by field.
FIELD_ANCHORS = {"spec": "spec-card", "ssh_keys": "launch-ssh-keys", "volumes": "launch-volumes"}


def _error_links(form) -> list[dict]:
    """The form's errors in the order of the page, each with the id of what to fix."""
    links = [{"anchor": None, "label": None, "errors": form.non_field_errors()}]
    for name, field in form.fields.items():
        if name in form.errors:
            links.append(
                {
                    "anchor": FIELD_ANCHORS.get(name, f"id_{name}"),
                    "label": field.label or name.replace("_", " ").capitalize(),
                    "errors": form.errors[name],
                }
            )
    return [link for link in links if link["errors"]]


@tenant_view(OPERATE)
def launch(request):
    tenant = request.membership.tenant
    form = LaunchForm(
        request.POST or None,
        initial={"region": Region.objects.first(), "image": services.default_image()},
        membership=request.membership,
    )
    if request.method == "POST" and "save_template" in request.POST and form.is_valid():
        if _save_as_template(request, form):
            return redirect("launch_templates:list")
    elif request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            instance = services.launch_instance(
                tenant,
                name=data["name"],
                ssh_keys=[key.name for key in data["ssh_keys"]],
                actor=request.user,
                **_launch_fields(data),
            )
        except ValidationError as error:
            for field, errors in error.message_dict.items():
                form.add_error(field if field in form.fields else None, errors)
        except DomainError as error:
            pages.refused(request, error.code, error.detail)
            form.add_error(None, error.detail)
        else:
            return _launched(request, instance)
    regions = list(Region.objects.all())
    specs = list(
        Spec.objects.filter(active=True)
        .select_related("gpu_model", "mig_profile")
        .prefetch_related("prices")
    )
    specs.sort(key=lambda spec: (spec.gpu_model.name, spec.mode, spec.current_price(), spec.code))
    quota = tenant.quota
    used = usage(tenant)
    checkers = [availability.Checker(quota, region) for region in regions]
    selected_region = _region_code(form["region"].value(), regions)
    rows = _spec_rows(checkers, specs, selected_region)
    return render(
        request,
        "instances/launch.html",
        {
            "form": form,
            "runnable": [row for row in rows if row["launchable"]],
            "folded": [row for row in rows if not row["launchable"]],
            "fit_count_limit": FIT_COUNT_LIMIT,
            "error_links": _error_links(form) if form.is_bound else [],
            "regions": regions,
            "quota": quota,
            "used": used,
            "selected_spec": form["spec"].value(),
            "image_options": _image_options(form, checkers, specs, selected_region),
        },
    )


def _image_options(form, checkers, specs, selected_region) -> list[dict]:
    """The form's catalog images (image_choices.options), each with what it is in the
    selected region (`now`), and which is checked: the form's, unless the region cannot
    obtain it, then the first it can."""
    found = image_choices.options(list(Image.objects.filter(active=True)), checkers, specs)
    chosen = form["image"].value()
    names = [
        o["image"].name for o in found if o["by_region"].get(selected_region, {}).get("launchable")
    ]
    if chosen not in names and not form.is_bound:
        chosen = names[0] if names else None
    spec = form["spec"].value()
    for option in found:
        now = option["by_region"].get(selected_region) or {}
        option["now"] = now
        option["cached"] = now.get("cached", {}).get(spec, "")
        option["checked"] = option["image"].name == chosen
        option["availability"] = json.dumps(option["by_region"])
    return found


def _launch_fields(data: dict) -> dict:
    """The launch form's fields that a template holds too, as launch_instance takes them."""
    return {
        "spec": data["spec"],
        "image": data["image"],
        "image_ref": data["image_ref"] or None,
        "region": data["region"],
        "disk_gib": data["disk_gib"],
        "ports": data["ports"],
        "command": data["command"],
        "env": data["env"],
        "secrets": data["secret_env"],
        "restart_policy": data["restart_policy"] or None,
        "on_host_loss": data["on_host_loss"],
        "volumes": data["volumes"],
    }


def _by_name(tenant, picks: list[dict]) -> list[dict]:
    """The launch form's volumes (by id) as a template keeps them: by name. A reference to
    none of the tenant's live volumes stays as it was, for the template's launch to refuse."""
    ids = [integers.reference_id(pick["volume"]) for pick in picks]
    names = dict(
        tenant.volumes.filter(pk__in=ids, deleted_at__isnull=True).values_list("pk", "name")
    )
    kept = []
    for pick, pk in zip(picks, ids, strict=True):
        entry = {"volume": names.get(pk, pick["volume"])}
        if pick["mount_path"]:
            entry["mount_path"] = pick["mount_path"]
        kept.append(entry)
    return kept


def _launched(request, instance):
    if instance.state == State.PENDING:
        messages.info(request, f"{instance.name} is queued: {instance.state_reason}")
    else:  # its state, live on the page, says how far it got
        messages.success(request, f"{instance.name} launched: a GPU slice is reserved.")
    return redirect("instances:detail", pk=instance.pk)


def _save_as_template(request, form) -> bool:
    """The launch form's "Save as template": the form's launch, not launched, as a template
    of the tenant named by its template name. Answers whether it was saved."""
    data = form.cleaned_data
    if not data["template_name"]:
        form.add_error("template_name", "Name the template to save.")
        return False
    tenant = request.membership.tenant
    fields = {**_launch_fields(data), "volumes": _by_name(tenant, data["volumes"])}
    try:
        template = template_services.create_template(
            tenant, name=data["template_name"], actor=request.user, **fields
        )
    except ValidationError as error:
        for field, errors in error.message_dict.items():
            target = "template_name" if field == "name" else field
            form.add_error(target if target in form.fields else None, errors)
        return False
    messages.success(request, f"Template {template.name} saved: launch it from here.")
    return True


@require_POST
@tenant_view(OPERATE)
def launch_template(request, template):
    """Launch from a template in one click (a generated name); its errors go back to the
    templates page."""
    try:
        chosen = template_services.find(request.membership.tenant, template)
    except ValidationError as error:
        raise Http404("No such template.") from error
    try:
        instance = services.launch_instance(
            request.membership.tenant,
            actor=request.user,
            **template_services.launch_fields(chosen, {}),
        )
    except ValidationError as error:
        messages.error(request, f"{chosen.name} was not launched: {' '.join(error.messages)}")
    except DomainError as error:
        pages.refused(request, error.code, error.detail)
        messages.error(request, f"{chosen.name} was not launched: {error.detail}")
    else:
        return _launched(request, instance)
    return redirect("launch_templates:list")


@require_POST
@tenant_view(OPERATE)
def save_template(request, pk):
    """An instance's "Save as template": what it was launched with, under the name given."""
    instance = get_object_or_404(_instances(request), pk=pk)
    name = request.POST.get("name", "").strip()[:80] or instance.name
    try:
        template = template_services.save_from_instance(instance, name, actor=request.user)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
        return redirect("instances:detail", pk=pk)
    messages.success(request, f"Template {template.name} saved from {instance.name}.")
    return redirect("launch_templates:list")


def _region_code(value, regions) -> str | None:
    """The selected region's code: the form's value is a code when posted, the initial
    Region (its pk) on a first view."""
    for region in regions:
        if value in (region.code, region.pk, str(region.pk)):
            return region.code
    return None


def _port_link(instance, entry: dict, can_operate: bool) -> str:
    """Where the instance page opens a port: with its app's sign-in query for members only."""
    query = sign_in.app_query(entry, instance.app_token) if can_operate else ""
    return access.port_path(instance.pk, entry["port"]) + (f"?{query}" if query else "")


def _announced_host(instance):
    """The instance's host (where it runs, else where its disk is) when its operator
    announced a drain or maintenance there."""
    current = [a.host for a in instance.allocations.all() if a.released_at is None]
    host = current[0] if current else instance.disk_host
    return host if host is not None and host.admin_status in Host.ANNOUNCED else None


def _detail_context(request, instance):
    can_operate = request.membership.can(OPERATE)
    actions = lifecycle.allowed_actions(instance.state, instance.restart_at)
    allocation = None
    if request.user.is_staff:
        allocation = instance.allocations.select_related("host").first()
    return {
        "instance": instance,
        "restarting": restarts.describe(
            instance.state, instance.restart_count, instance.restart_at, timezone.now()
        ),
        "announced_host": _announced_host(instance),
        "events": instance.events.order_by("-at", "-pk")[:100],
        "actions": actions,
        "can_operate": can_operate,
        "resize_options": resize_options(instance) if can_operate and "resize" in actions else [],
        "allocation": allocation,
        "placement": placement.describe(allocation) if allocation else None,
        "per_month": instance.spec.current_price() * HOURS_PER_MONTH,
        "ssh": access.ssh_target(instance) if request.membership.can(OPERATE) else None,
        "ports": [
            {**entry, "path": _port_link(instance, entry, can_operate)}
            for entry in access.declared_ports(instance.image_ports, instance.ports)
        ],
    }


@tenant_view(READ)
def detail(request, pk):
    instance = get_object_or_404(
        _instances(request).prefetch_related(
            Prefetch("allocations", queryset=Allocation.objects.select_related("host"))
        ),
        pk=pk,
    )
    template = "instances/_live.html" if request.GET.get("partial") else "instances/detail.html"
    return render(request, template, _detail_context(request, instance))


ACTIONS = {
    "stop": services.stop_instance,
    "start": services.start_instance,
    "reboot": services.reboot_instance,
}
# What ends a running instance's processes asks first: a page, then a POST with confirm.
ASKS = {
    "stop": "Stopping ends every process in it and frees its GPU; its disk and what is on it "
    "stay, and Start runs it again.",
    "reboot": "Rebooting ends every process in it and starts its workload again on the same "
    "GPU; its disk and what is on it stay.",
}


@require_POST
@tenant_view(OPERATE)
def act(request, pk, action):
    instance = get_object_or_404(_instances(request), pk=pk)
    if action == "resize":
        return _resize(request, instance)
    if action in ASKS and instance.state == State.RUNNING and not request.POST.get("confirm"):
        context = {"instance": instance, "action": action, "why": ASKS[action]}
        return render(request, "instances/confirm_action.html", context)
    try:
        ACTIONS[action](instance, actor=request.user)
        messages.success(request, f"{action.capitalize()} of {instance.name} requested.")
    except DomainError as error:
        pages.refused(request, error.code, error.detail)
        messages.error(request, error.detail)
    return redirect("instances:detail", pk=pk)


def _resize(request, instance):
    """Resize; one that restarts or stops a running instance asks first (a page, then a POST
    with confirm naming what was agreed to)."""
    form = ResizeForm(request.POST, instance=instance)
    if not form.is_valid():
        messages.error(request, " ".join(e for errors in form.errors.values() for e in errors))
        return redirect("instances:detail", pk=instance.pk)
    spec, disk_gib = form.cleaned_data["spec"], form.cleaned_data["disk_gib"]
    confirm = form.cleaned_data["confirm"]
    try:
        resized = services.resize_instance(
            instance,
            spec,
            disk_gib=disk_gib,
            allow_restart=confirm == resizing.RESTART,
            allow_stop=confirm == resizing.STOP,
            actor=request.user,
        )
    except services.NeedsConsent as consent:
        context = {
            "instance": instance,
            "spec": spec,
            "disk_gib": disk_gib,
            "why": consent.detail,
            "impact": consent.impact,
        }
        return render(request, "instances/resize_confirm.html", context)
    except DomainError as error:
        pages.refused(request, error.code, error.detail)
        messages.error(request, error.detail)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    else:
        live = resized.state == State.RUNNING
        how = " live: it keeps running" if live else ""
        messages.success(request, f"Resizing {instance.name} to {spec.name}{how}.")
    return redirect("instances:detail", pk=instance.pk)


@tenant_view(OPERATE)
def terminate(request, pk):
    """Terminating asks first: this page, then a POST."""
    instance = get_object_or_404(_instances(request), pk=pk)
    if request.method == "POST":
        try:
            keep_disk = request.POST.get("keep_disk") == "1"
            services.terminate_instance(instance, keep_disk=keep_disk, actor=request.user)
        except DomainError as error:
            pages.refused(request, error.code, error.detail)
            messages.error(request, error.detail)
        except ValidationError as error:
            messages.error(request, " ".join(error.messages))
        else:
            messages.success(request, f"{instance.name} is being terminated.")
        return redirect("instances:detail", pk=pk)
    if "terminate" not in lifecycle.allowed_actions(instance.state):
        messages.error(request, f"{instance.name} is {instance.state}; it cannot be terminated.")
        return redirect("instances:detail", pk=pk)
    return render(request, "instances/terminate.html", {"instance": instance})
