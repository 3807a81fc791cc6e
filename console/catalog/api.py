from rest_framework import viewsets

from console.catalog.models import Image, Region, Spec
from console.catalog.serializers import ImageSerializer, RegionSerializer, SpecSerializer


class SpecViewSet(viewsets.ReadOnlyModelViewSet):
    """Active specs (flavors) a tenant can launch."""

    serializer_class = SpecSerializer
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


class ImageViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = ImageSerializer
    lookup_field = "name"
    lookup_value_regex = "[^/]+"
    queryset = Image.objects.filter(active=True)


class RegionViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = RegionSerializer
    lookup_field = "code"
    queryset = Region.objects.all()
