"""The console's Volumes page: the tenant's volumes, creating one (its price shown first),
attaching one to a stopped instance, and detaching or deleting one after a confirmation."""

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from accounts.guards import tenant_view
from accounts.roles import OPERATE, READ
from console import integers
from console.audit import pages
from console.catalog.models import Region
from console.errors import DomainError
from console.instances.models import Instance
from console.volumes import services
from console.volumes.models import Volume

CONFIRM = {
    "detach": "Detach {name} from {instance}? It keeps its data; {instance} no longer mounts it.",
    "delete": "Delete {name}? Its data is deleted for good, and its billing ends.",
}
ACTIONS = {"detach": services.detach_volume, "delete": services.delete_volume}


def _volumes(request):
    tenant = request.membership.tenant
    return Volume.objects.filter(tenant=tenant, deleted_at__isnull=True)


def _act(request, action, done: str) -> bool:
    try:
        action()
    except DomainError as error:
        pages.refused(request, error.code, error.detail)
        messages.error(request, error.detail)
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    else:
        messages.success(request, done)
        return True
    return False


@tenant_view(READ)
def volumes(request):
    tenant = request.membership.tenant
    regions = list(Region.objects.order_by("code"))
    return render(
        request,
        "volumes/list.html",
        {
            "volumes": _volumes(request).select_related("region", "host", "instance"),
            "regions": regions,
            "instances": Instance.objects.filter(
                tenant=tenant, state__in=services.ATTACHABLE
            ).order_by("name"),
            "used": services.storage_used(tenant),
            "quota": tenant.quota.storage_quota_gib,
            "can_operate": request.membership.can(OPERATE),
        },
    )


@require_POST
@tenant_view(READ, OPERATE)
def create(request):
    region = Region.objects.filter(code=request.POST.get("region", "")).first()
    name = request.POST.get("name", "")
    try:
        size_gib = integers.parse(
            request.POST.get("size_gib", ""), minimum=1, maximum=services.MAX_SIZE_GIB
        )
    except integers.NotAWholeNumber:
        size_gib = None
    if region is None:
        messages.error(request, "Choose a region.")
    elif size_gib is None:
        messages.error(request, f"Give the size in whole GiB, 1 to {services.MAX_SIZE_GIB}.")
    else:
        _act(
            request,
            lambda: services.create_volume(
                request.membership.tenant,
                name=name,
                size_gib=size_gib,
                region=region,
                actor=request.user,
            ),
            f"Volume {name} created.",
        )
    return redirect("volumes:list")


@require_POST
@tenant_view(READ, OPERATE)
def attach(request, pk):
    volume = get_object_or_404(_volumes(request), pk=pk)
    try:
        instance_pk = integers.parse(request.POST.get("instance", ""), minimum=1)
    except integers.NotAWholeNumber:
        raise Http404("No such instance.") from None
    instance = get_object_or_404(
        Instance.objects.live(), tenant=request.membership.tenant, pk=instance_pk
    )
    _act(
        request,
        lambda: services.attach_volume(
            volume, instance, mount_path=request.POST.get("mount_path") or None, actor=request.user
        ),
        f"{volume.name} attached to {instance.name}.",
    )
    return redirect("volumes:list")


@tenant_view(READ, OPERATE)
def confirm(request, pk, action):
    """Detaching and deleting ask first: this page, then a POST."""
    volume = get_object_or_404(_volumes(request).select_related("instance"), pk=pk)
    if request.method == "POST":
        act = ACTIONS[action]
        _act(request, lambda: act(volume, actor=request.user), f"{volume.name}: {action} done.")
        return redirect("volumes:list")
    instance = volume.instance.name if volume.instance_id else ""
    question = CONFIRM[action].format(name=volume.name, instance=instance)
    return render(
        request,
        "volumes/confirm.html",
        {"volume": volume, "action": action, "question": question},
    )
