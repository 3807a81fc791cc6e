"""REST API of volumes: /api/v1/volumes/ (and /api/v1/volumes/price/, what one would cost)."""

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from accounts.permissions import request_membership
from console import integers
from console.catalog.models import Region
from console.instances.models import Instance
from console.volumes import services
from console.volumes.models import Volume
from console.volumes.serializers import (
    AttachSerializer,
    PriceSerializer,
    VolumeCreateSerializer,
    VolumeSerializer,
)


class VolumeViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """The tenant's volumes: disks of their own, billed per GiB-second from creation to
    deletion. One lives on the host of the first instance it is attached to; an instance with
    volumes runs on that host."""

    serializer_class = VolumeSerializer
    lookup_value_regex = "[0-9]+"
    api_scopes = {
        "list": "volumes:read",
        "retrieve": "volumes:read",
        "price": "volumes:read",
        "create": "volumes:write",
        "attach": "volumes:write",
        "detach": "volumes:write",
        "destroy": "volumes:write",
    }

    def get_queryset(self):
        tenant = request_membership(self.request).tenant
        volumes = Volume.objects.filter(tenant=tenant, deleted_at__isnull=True)
        return volumes.select_related("region", "host")

    @extend_schema(request=VolumeCreateSerializer, responses={201: VolumeSerializer})
    def create(self, request):
        body = VolumeCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        region = data.get("region") or Region.objects.order_by("code").first()
        if region is None:
            raise ValidationError({"region": ["There is no region yet."]})
        volume = services.create_volume(
            request_membership(request).tenant,
            name=data["name"],
            size_gib=data["size_gib"],
            region=region,
            actor=request.user,
        )
        return Response(VolumeSerializer(volume).data, status=status.HTTP_201_CREATED)

    def destroy(self, request, pk=None):
        services.delete_volume(self.get_object(), actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=AttachSerializer, responses={200: VolumeSerializer})
    @action(detail=True, methods=["post"])
    def attach(self, request, pk=None):
        """Attach to a stopped instance: mounted at `mount_path` from its next start."""
        volume = self.get_object()
        body = AttachSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        instance = Instance.objects.live().filter(tenant=volume.tenant, pk=data["instance"]).first()
        if instance is None:
            raise ValidationError({"instance": ["No such instance."]})
        volume = services.attach_volume(
            volume, instance, mount_path=data.get("mount_path"), actor=request.user
        )
        return Response(VolumeSerializer(volume).data)

    @extend_schema(request=None, responses={200: VolumeSerializer})
    @action(detail=True, methods=["post"])
    def detach(self, request, pk=None):
        """Detach from its instance, which must be stopped."""
        volume = services.detach_volume(self.get_object(), actor=request.user)
        return Response(VolumeSerializer(volume).data)

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "size_gib",
                {"type": "integer", "minimum": 1, "maximum": services.MAX_SIZE_GIB},
                required=True,
            ),
            OpenApiParameter("region", str),
        ],
        responses={200: PriceSerializer},
    )
    @action(detail=False, methods=["get"])
    def price(self, request):
        """What a volume of `size_gib` in `region` would cost, before creating it."""
        text = request.query_params.get("size_gib", "")
        try:
            size_gib = integers.parse(text, minimum=1, maximum=services.MAX_SIZE_GIB)
        except integers.NotAWholeNumber as error:
            raise ValidationError({"size_gib": [str(error)]}) from None
        code = request.query_params.get("region")
        regions = Region.objects.order_by("code")
        region = regions.filter(code=code).first() if code else regions.first()
        if region is None:
            raise ValidationError({"region": ["No such region."]})
        shown = {
            "region": region.code,
            "size_gib": size_gib,
            "price_per_gib_month": region.volume_price_per_gib_month,
            "price_per_month": services.monthly_price(region, size_gib),
        }
        return Response(PriceSerializer(shown).data)
