"""GET /api/v1/instances/<id>/metrics/?range=10m|1h|24h|7d: an instance's chart data."""

from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts import scopes
from accounts.permissions import request_membership
from accounts.roles import READ
from console.errors import ErrorCode
from console.instances.models import Instance
from console.metrics import history
from console.metrics.ingest import instance_series


def chosen_range(request) -> str:
    name = request.query_params.get("range", "10m")
    if name not in history.RANGES:
        raise exceptions.ValidationError(
            {"range": [f"must be one of {', '.join(history.RANGES)}, not {name!r}"]},
            code=ErrorCode.INVALID_RANGE,
        )
    return name


class InstanceMetricsView(APIView):
    """An instance's utilization, memory, temperature and power over a time range: every sample
    for 10m (the live window), 1-minute points for 1h and 24h, 10-minute points for 7d, each with
    its min and max; `ts` in epoch seconds. Only the instance's tenant sees it."""

    read_role = READ
    api_scopes = "metrics:read"

    @extend_schema(
        parameters=[
            OpenApiParameter("range", str, enum=list(history.RANGES), default="10m"),
        ],
        responses=OpenApiTypes.OBJECT,
    )
    def get(self, request, pk: int):
        membership = request_membership(request)
        instance = get_object_or_404(
            Instance,
            pk=pk,
            tenant_id=membership.tenant_id,
            name__startswith=scopes.instance_prefix(membership),
        )
        data = history.chart_data(instance_series(instance.pk), chosen_range(request))
        return Response({"instance": instance.pk, **data})
