"""The console's Snapshots page: the tenant's snapshots with their progress, taking one (of an
instance's disk or of a volume: the Volumes page has a button too), deleting one, restoring
one into a new volume, the schedules, and shelving an instance (its button is on the
instance's page)."""

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.db.models import Q
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from accounts.guards import tenant_view
from accounts.roles import OPERATE, READ
from console import integers
from console.audit import pages
from console.errors import DomainError
from console.instances.models import Instance
from console.snapshots import services
from console.snapshots.models import Restore, Schedule, Shelf, Snapshot
from console.volumes.models import Volume


def _instances(request):
    return Instance.objects.live().filter(tenant=request.membership.tenant)


def _volumes(request):
    return Volume.objects.filter(tenant=request.membership.tenant, deleted_at__isnull=True)


def _source(request) -> Instance | Volume:
    """The tenant's instance or volume that the form's `source` names (`instance:ID` or
    `volume:ID`); 404 otherwise."""
    kind, _, pk = request.POST.get("source", "").partition(":")
    rows = {"instance": _instances, "volume": _volumes}.get(kind)
    try:
        pk = integers.parse(pk, minimum=1)
    except integers.NotAWholeNumber:
        raise Http404("No such instance or volume.") from None
    if rows is None:
        raise Http404("No such instance or volume.")
    return get_object_or_404(rows(request), pk=pk)


def _whole(request, name: str) -> int | None:
    """The form's number `name`, None when left empty; a ValidationError on it otherwise."""
    text = request.POST.get(name, "")
    try:
        return integers.parse(text, minimum=1) if text else None
    except integers.NotAWholeNumber as error:
        raise ValidationError({name: f"{name.replace('_', ' ')}: {error}"}) from None


@tenant_view(READ)
def snapshots(request):
    tenant = request.membership.tenant
    listed = Snapshot.objects.filter(tenant=tenant, deleted_at__isnull=True)
    shelves = Shelf.objects.filter(instance__tenant=tenant).select_related("instance")
    restores = list(
        Restore.objects.filter(tenant=tenant, volume__isnull=False).select_related(
            "volume", "host"
        )[:20]
    )
    return render(
        request,
        "snapshots/list.html",
        {
            "snapshots": listed,
            "running": any(s.state == Snapshot.State.RUNNING for s in listed)
            or any(shelf.state != Shelf.State.SHELVED for shelf in shelves)
            or any(restore.state == Restore.State.RUNNING for restore in restores),
            "schedules": Schedule.objects.filter(tenant=tenant)
            .filter(Q(volume__isnull=True) | Q(volume__deleted_at__isnull=True))
            .select_related("instance", "volume"),
            "shelves": shelves,
            "restores": restores,
            "instances": _instances(request).filter(disk_host__isnull=False).order_by("name"),
            "volumes": _volumes(request).filter(host__isnull=False).order_by("name"),
            "hosts": services.restore_hosts({s.region_id for s in listed}),
            "can_operate": request.membership.can(OPERATE),
        },
    )


def _act(request, action, done: str):
    try:
        action()
    except DomainError as error:
        pages.refused(request, error.code, error.detail)
        messages.error(request, error.detail)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    else:
        messages.success(request, done)


@require_POST
@tenant_view(READ, OPERATE)
def take(request):
    what = _source(request)
    if isinstance(what, Instance):
        _act(
            request,
            lambda: services.take_snapshot(what, actor=request.user),
            f"Snapshot of {what.name} started.",
        )
    else:
        _act(
            request,
            lambda: services.take_volume_snapshot(what, actor=request.user),
            f"Snapshot of volume {what.name} started.",
        )
    return redirect("snapshots:list")


@require_POST
@tenant_view(READ, OPERATE)
def restore(request, pk):
    tenant = request.membership.tenant
    snapshot = get_object_or_404(Snapshot, pk=pk, tenant=tenant, deleted_at__isnull=True)
    name = request.POST.get("name", "").strip()
    _act(
        request,
        lambda: services.restore_to_volume(
            snapshot,
            name=name,
            size_gib=_whole(request, "size_gib"),
            host=request.POST.get("host", ""),
            actor=request.user,
        ),
        f"Restoring snapshot {snapshot.pk} into the new volume {name}.",
    )
    return redirect("snapshots:list")


@require_POST
@tenant_view(READ, OPERATE)
def delete(request, pk):
    tenant = request.membership.tenant
    snapshot = get_object_or_404(Snapshot, pk=pk, tenant=tenant, deleted_at__isnull=True)
    _act(
        request,
        lambda: services.delete_snapshot(snapshot, actor=request.user),
        f"Snapshot {snapshot.pk} deleted.",
    )
    return redirect("snapshots:list")


@require_POST
@tenant_view(READ, OPERATE)
def schedule(request):
    what = _source(request)
    try:
        every, keep = _whole(request, "every_hours") or 0, _whole(request, "keep") or 0
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
        return redirect("snapshots:list")
    _act(
        request,
        lambda: services.set_schedule(what, every, keep),
        f"{what.name}: a snapshot every {every} h, the newest {keep} kept.",
    )
    return redirect("snapshots:list")


@require_POST
@tenant_view(READ, OPERATE)
def unschedule(request, pk):
    found = get_object_or_404(Schedule, pk=pk, tenant=request.membership.tenant)
    services.delete_schedule(found)
    messages.success(request, f"{found.source_name}: no more scheduled snapshots.")
    return redirect("snapshots:list")


@require_POST
@tenant_view(READ, OPERATE)
def shelve(request, pk):
    instance = get_object_or_404(_instances(request), pk=pk)
    _act(
        request,
        lambda: services.shelve_instance(instance, actor=request.user),
        f"Shelving {instance.name}: its disk goes to a snapshot; Start restores it.",
    )
    return redirect("instances:detail", pk=instance.pk)
