"""The catalog's REST API: /api/v1/specs/, /images/, /regions/ (read only)."""

from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import viewsets
from rest_framework.exceptions import ValidationError

from accounts.permissions import request_membership
from console.catalog.models import Image, Region, Spec
from console.catalog.serializers import ImageSerializer, RegionSerializer, SpecSerializer
from console.fleet.image_availability import Fleet
from console.instances.availability import Checker

REGION_PARAMETER = OpenApiParameter(
    "region",
    str,
    description="a region's code: each spec's `availability` there for your tenant (fits "
    "now, queues, no such hardware, over your quota); without it, `availability` is null",
)


IMAGE_REGION_PARAMETER = OpenApiParameter(
    "region",
    str,
    description="a region's code: each image's `availability` there (held by its hosts, "
    "through its mirror, from its registry, registry unreachable, not built); without it, "
    "`availability` is null",
)


def region_asked(request) -> Region | None:
    """The region of the `region` query parameter (None without one); 400 for an unknown
    code."""
    code = request.query_params.get("region") if request else None
    if not code:
        return None
    region = Region.objects.filter(code=code).first()
    if region is None:
        raise ValidationError({"region": [f"No region {code}: see /api/v1/regions/."]})
    return region


@extend_schema_view(
    list=extend_schema(parameters=[REGION_PARAMETER]),
    retrieve=extend_schema(parameters=[REGION_PARAMETER]),
)
class SpecViewSet(viewsets.ReadOnlyModelViewSet):
    """Active specs (flavors) a tenant can launch."""

    serializer_class = SpecSerializer
    api_scopes = "catalog:read"
    lookup_field = "code"
    lookup_value_regex = "[^/]+"
    queryset = (
        Spec.objects.filter(active=True)
        .select_related("gpu_model", "mig_profile")
        .prefetch_related("prices")
    )

    def get_queryset(self):
        queryset = super().get_queryset()
        for field in ("mode", "gpu_model"):
            value = self.request.query_params.get(field)
            if value:
                key = "gpu_model__code" if field == "gpu_model" else field
                queryset = queryset.filter(**{key: value})
        return queryset

    def get_serializer_context(self):
        context = super().get_serializer_context()
        region = region_asked(self.request)
        if region is not None:
            context["availability"] = Checker(request_membership(self.request).tenant.quota, region)
        return context


@extend_schema_view(
    list=extend_schema(parameters=[IMAGE_REGION_PARAMETER]),
    retrieve=extend_schema(parameters=[IMAGE_REGION_PARAMETER]),
)
class ImageViewSet(viewsets.ReadOnlyModelViewSet):
    """Active catalog images, and where each can come from in a region."""

    serializer_class = ImageSerializer
    api_scopes = "catalog:read"
    lookup_field = "name"
    lookup_value_regex = "[^/]+"
    queryset = Image.objects.filter(active=True)

    def get_serializer_context(self):
        context = super().get_serializer_context()
        region = region_asked(self.request)
        if region is not None:
            context["image_availability"] = Fleet(region)
        return context


class RegionViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = RegionSerializer
    api_scopes = "catalog:read"
    lookup_field = "code"
    queryset = Region.objects.all()
