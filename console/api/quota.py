from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.permissions import request_membership
from accounts.serializers import QuotaSerializer
from console.instances.quota import usage


class QuotaView(APIView):
    """The tenant's limits and what its instances use now."""

    api_scopes = "quota:read"

    @extend_schema(responses=QuotaSerializer)
    def get(self, request):
        tenant = request_membership(request).tenant
        quota = tenant.quota
        used = usage(tenant)
        data = {
            "gpu_quota": quota.gpu_quota,
            "gpu_used": used.gpu_used,
            "max_instances": quota.max_instances,
            "instances_used": used.instances_used,
            "monthly_budget": quota.monthly_budget,
            "budget_action": quota.budget_action,
        }
        return Response(QuotaSerializer(data).data)
