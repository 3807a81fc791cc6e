"""REST API of the idle policies: the tenant's default (/api/v1/idle-policy/), an instance's own
and the policy in force on it (/api/v1/instances/{id}/idle-policy/), and keeping a warned
instance running (/api/v1/instances/{id}/keep-running/)."""

from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import NotFound
from rest_framework.parsers import JSONParser
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts import scopes
from accounts.permissions import request_membership
from accounts.roles import MANAGE, OPERATE, READ
from console.idle import services
from console.idle.models import InstancePolicy, OperatorPolicy, TenantPolicy
from console.idle.serializers import InstancePolicyAnswer, PolicySerializer, TenantPolicyAnswer
from console.instances.models import Instance

TENANT_POLICY_SCOPES = {"get": "idle:read", "put": "idle:tenant", "delete": "idle:tenant"}
INSTANCE_POLICY_SCOPES = {"get": "idle:read", "put": "idle:write", "delete": "idle:write"}


def _shown(policy) -> dict | None:
    return PolicySerializer(policy).data if policy is not None else None


def _valid(request) -> dict:
    body = PolicySerializer(data=request.data)
    body.is_valid(raise_exception=True)
    return dict(body.validated_data)


class TenantPolicyView(APIView):
    parser_classes = [JSONParser]  # a policy is JSON: no form's "0" for false, "" for none
    """The tenant's default idle policy (admins write it), beside the operator's, which it
    cannot weaken: a weaker field is a 400 on that field."""

    read_role = READ
    write_role = MANAGE
    api_scopes = TENANT_POLICY_SCOPES

    def _answer(self, tenant) -> Response:
        return Response(
            {
                "policy": _shown(TenantPolicy.objects.filter(tenant=tenant).first()),
                "operator_policy": _shown(OperatorPolicy.objects.filter(tenant=tenant).first()),
            }
        )

    @extend_schema(responses=TenantPolicyAnswer)
    def get(self, request):
        return self._answer(request_membership(request).tenant)

    @extend_schema(request=PolicySerializer, responses=TenantPolicyAnswer)
    def put(self, request):
        tenant = request_membership(request).tenant
        services.set_tenant_policy(tenant, _valid(request), actor=request.user)
        return self._answer(tenant)

    @extend_schema(request=None, responses={200: TenantPolicyAnswer})
    def delete(self, request):
        tenant = request_membership(request).tenant
        services.clear_tenant_policy(tenant, actor=request.user)
        return self._answer(tenant)


class InstanceView(APIView):
    parser_classes = [JSONParser]

    def instance(self, pk: int) -> Instance:
        membership = request_membership(self.request)
        found = Instance.objects.filter(tenant=membership.tenant, pk=pk)
        prefix = scopes.instance_prefix(membership)
        found = found.filter(name__startswith=prefix) if prefix else found
        instance = found.select_related("tenant").first()
        if instance is None:
            raise NotFound()
        return instance

    def answer(self, instance: Instance) -> Response:
        status = services.status(instance)
        own = InstancePolicy.objects.filter(instance=instance).first()
        return Response({**status, "policy": _shown(own), "in_force": _shown(status["in_force"])})


class InstancePolicyView(InstanceView):
    """An instance's own idle policy, the policy in force on it (the strictest of the three
    levels) and when it acts."""

    read_role = READ
    write_role = OPERATE
    api_scopes = INSTANCE_POLICY_SCOPES

    @extend_schema(responses=InstancePolicyAnswer)
    def get(self, request, pk: int):
        return self.answer(self.instance(pk))

    @extend_schema(request=PolicySerializer, responses=InstancePolicyAnswer)
    def put(self, request, pk: int):
        instance = self.instance(pk)
        services.set_instance_policy(instance, _valid(request), actor=request.user)
        return self.answer(instance)

    @extend_schema(request=None, responses={200: InstancePolicyAnswer})
    def delete(self, request, pk: int):
        instance = self.instance(pk)
        services.clear_instance_policy(instance, actor=request.user)
        return self.answer(instance)


class KeepRunningView(InstanceView):
    """Put off the action a warning announced, once per run, where the policy in force allows
    it; 409 `keep_running_refused`, `keep_running_forbidden` or `kept_running_already`."""

    write_role = OPERATE
    api_scopes = {"post": "idle:write"}

    @extend_schema(request=None, responses=InstancePolicyAnswer)
    def post(self, request, pk: int):
        instance = self.instance(pk)
        services.keep_running(instance, actor=request.user)
        return self.answer(instance)
