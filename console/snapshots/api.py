"""REST API of snapshots: /api/v1/snapshots/, /api/v1/snapshot-schedules/ and
/api/v1/instances/{id}/shelve/."""

from django.db.models import Q
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts import scopes
from accounts.permissions import request_membership
from console.instances.models import Instance
from console.snapshots import services
from console.snapshots.models import Restore, Schedule, Shelf, Snapshot
from console.snapshots.serializers import (
    RestoreToVolumeSerializer,
    ScheduleCreateSerializer,
    ScheduleSerializer,
    ShelfSerializer,
    SnapshotCreateSerializer,
    SnapshotSerializer,
    VolumeRestoreSerializer,
)
from console.volumes.services import tenant_volume


def tenant_instances(request):
    """The instances the request may act on: its tenant's live ones (within its token's
    name prefix)."""
    membership = request_membership(request)
    instances = Instance.objects.live().filter(tenant=membership.tenant)
    prefix = scopes.instance_prefix(membership)
    return instances.filter(name__startswith=prefix) if prefix else instances


def tenant_instance(request, pk, field: str | None = None) -> Instance:
    """One of them; 404 (or a 400 on `field`) when the tenant has no such instance."""
    instance = tenant_instances(request).filter(pk=pk).first()
    if instance is None:
        if field:
            raise ValidationError({field: ["No such instance."]})
        raise NotFound()
    return instance


def source(request, data: dict):
    """The instance or the volume the request names (a 400 on its field when the tenant has
    none such, or none within the request's token's name prefix)."""
    if "volume" in data:
        membership = request_membership(request)
        prefix = scopes.instance_prefix(membership)
        return tenant_volume(membership.tenant, data["volume"], "volume", name_prefix=prefix)
    return tenant_instance(request, data["instance"], "instance")


class SnapshotViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """The tenant's snapshots of its instances' disks and of its volumes. A new one answers
    202: watch its `state`, `percent` and `eta_seconds` until it is `done` (or `failed`). A
    done one is restored into a new volume by `restore`. A token confined to a name prefix
    sees (and snapshots) only the instances and volumes whose name starts with it."""

    serializer_class = SnapshotSerializer
    lookup_value_regex = "[0-9]+"
    api_scopes = {
        "list": "snapshots:read",
        "retrieve": "snapshots:read",
        "create": "snapshots:write",
        "destroy": "snapshots:write",
        "restore": "volumes:write",
    }

    def get_queryset(self):
        membership = request_membership(self.request)
        snapshots = Snapshot.objects.filter(tenant=membership.tenant, deleted_at__isnull=True)
        prefix = scopes.instance_prefix(membership)
        if prefix:
            snapshots = snapshots.filter(source_name__startswith=prefix)
        return snapshots.select_related("host")

    @extend_schema(request=SnapshotCreateSerializer, responses={202: SnapshotSerializer})
    def create(self, request):
        body = SnapshotCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        what = source(request, body.validated_data)
        if isinstance(what, Instance):
            snapshot = services.take_snapshot(what, actor=request.user)
        else:
            snapshot = services.take_volume_snapshot(what, actor=request.user)
        return Response(SnapshotSerializer(snapshot).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=RestoreToVolumeSerializer, responses={202: VolumeRestoreSerializer})
    @action(detail=True, methods=["post"])
    def restore(self, request, pk=None):
        """Restore the snapshot into a new volume (billed as a volume from now), on `host` or
        on any host of its region: watch its progress under /api/v1/snapshot-restores/. An
        instance the volume is attached to meanwhile starts once it is restored."""
        body = RestoreToVolumeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        restore = services.restore_to_volume(
            self.get_object(),
            name=data["name"],
            size_gib=data.get("size_gib"),
            host=data.get("host", ""),
            actor=request.user,
        )
        return Response(VolumeRestoreSerializer(restore).data, status=status.HTTP_202_ACCEPTED)

    def destroy(self, request, pk=None):
        services.delete_snapshot(self.get_object(), actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class ScheduleViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Snapshots on a schedule: one per instance or volume, every `every_hours`, the newest
    `keep` of them kept. Creating one for an instance (or a volume) that has one replaces it."""

    serializer_class = ScheduleSerializer
    lookup_value_regex = "[0-9]+"
    api_scopes = {
        "list": "snapshots:read",
        "retrieve": "snapshots:read",
        "create": "snapshots:write",
        "destroy": "snapshots:write",
    }

    def get_queryset(self):
        membership = request_membership(self.request)
        of_volumes = Q(
            tenant=membership.tenant,
            volume__isnull=False,
            volume__deleted_at__isnull=True,
            volume__name__startswith=scopes.instance_prefix(membership),
        )
        return Schedule.objects.filter(
            Q(instance__in=tenant_instances(self.request)) | of_volumes
        ).select_related("instance", "volume")

    @extend_schema(request=ScheduleCreateSerializer, responses={201: ScheduleSerializer})
    def create(self, request):
        body = ScheduleCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        what = source(request, data)
        schedule = services.set_schedule(what, data["every_hours"], data["keep"])
        return Response(ScheduleSerializer(schedule).data, status=status.HTTP_201_CREATED)

    def destroy(self, request, pk=None):
        services.delete_schedule(self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class RestoreViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Snapshots being restored (or restored) into new volumes, with their progress."""

    serializer_class = VolumeRestoreSerializer
    lookup_value_regex = "[0-9]+"
    api_scopes = {"list": "snapshots:read", "retrieve": "snapshots:read"}

    def get_queryset(self):
        membership = request_membership(self.request)
        return Restore.objects.filter(
            tenant=membership.tenant,
            volume__isnull=False,
            volume__name__startswith=scopes.instance_prefix(membership),
        ).select_related("volume", "host")


class ShelveView(APIView):
    """Shelve a stopped instance: its disk is snapshotted and removed from its host, it
    holds no GPU and costs only the snapshot's storage. `start` restores it on any host that
    fits, with the same id, name, ssh command, port URLs and env."""

    api_scopes = {"get": "instances:read", "post": "instances:shelve"}

    @extend_schema(responses=ShelfSerializer)
    def get(self, request, pk):
        """The instance's shelf: shelving, shelved, or unshelving with its restore's progress
        (bytes done of total, ETA); 404 when it is not shelved."""
        shelf = Shelf.objects.filter(instance=tenant_instance(request, pk)).first()
        if shelf is None:
            raise NotFound("This instance is not shelved.")
        return Response(ShelfSerializer(shelf).data)

    @extend_schema(request=None, responses={202: ShelfSerializer})
    def post(self, request, pk):
        instance = tenant_instance(request, pk)
        shelf = services.shelve_instance(instance, actor=request.user)
        return Response(ShelfSerializer(shelf).data, status=status.HTTP_202_ACCEPTED)
