"""REST API of the tenant's registry credentials: /api/v1/registry-credentials/… Admins and
owners list, add (or replace) and remove them; the token or password is write-only. Members
use them without seeing them: a launch whose image is in such a registry pulls with it."""

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.response import Response

from accounts.permissions import request_membership
from accounts.roles import MANAGE
from console.registry_credentials import services
from console.registry_credentials.models import RegistryCredential
from console.registry_credentials.serializers import (
    NewRegistryCredentialSerializer,
    RegistryCredentialSerializer,
)


class RegistryCredentialViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet
):
    serializer_class = RegistryCredentialSerializer
    lookup_value_regex = "[0-9]+"
    read_role = MANAGE
    write_role = MANAGE
    api_scopes = {
        "list": "registries:read",
        "retrieve": "registries:read",
        "create": "registries:write",
        "destroy": "registries:write",
    }

    def get_queryset(self):
        return RegistryCredential.objects.filter(tenant=request_membership(self.request).tenant)

    @extend_schema(
        request=NewRegistryCredentialSerializer, responses={201: RegistryCredentialSerializer}
    )
    def create(self, request):
        body = NewRegistryCredentialSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        credential = services.save_credential(
            request_membership(request).tenant, actor=request.user, **body.validated_data
        )
        return Response(self.get_serializer(credential).data, status=status.HTTP_201_CREATED)

    def destroy(self, request, pk=None):
        services.remove_credential(self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)
