"""REST API of launch templates: /api/v1/templates/… A tenant's own templates and the
published ones; members save, change and delete their tenant's, viewers read."""

from drf_spectacular.utils import extend_schema
from rest_framework import status, viewsets
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from accounts.permissions import request_membership
from accounts.roles import OPERATE, READ
from console.launch_templates import services
from console.launch_templates.serializers import TemplateSerializer


def _as_launch(data: dict) -> dict:
    """A serializer's validated data as the services take it (secrets under `secrets`)."""
    fields = dict(data)
    if "secret_env" in fields:
        fields["secrets"] = fields.pop("secret_env")
    return fields


class TemplateViewSet(viewsets.ModelViewSet):
    """Saved launches: `POST /api/v1/instances/` with `template` (an id or a name) launches
    one, any of its fields overridden by the body's. Published templates (`public`, made by
    operators) are read-only here."""

    serializer_class = TemplateSerializer
    lookup_value_regex = "[0-9]+"
    read_role = READ
    write_role = OPERATE
    api_scopes = {
        "list": "templates:read",
        "retrieve": "templates:read",
        "create": "templates:write",
        "update": "templates:write",
        "partial_update": "templates:write",
        "destroy": "templates:write",
    }

    def _tenant(self):
        return request_membership(self.request).tenant

    def get_queryset(self):
        return services.visible(self._tenant())

    def get_serializer_context(self):
        return {**super().get_serializer_context(), "tenant": self._tenant()}

    def _own(self):
        """The template to change: one of the tenant's own (a published one is not found)."""
        template = self.get_object()
        if template.tenant_id != self._tenant().pk:
            raise NotFound()
        return template

    @extend_schema(responses={201: TemplateSerializer})
    def create(self, request):
        body = self.get_serializer(data=request.data)
        body.is_valid(raise_exception=True)
        template = services.create_template(
            self._tenant(), actor=request.user, **_as_launch(body.validated_data)
        )
        return Response(self.get_serializer(template).data, status=status.HTTP_201_CREATED)

    def update(self, request, pk=None, partial=False):
        template = self._own()
        body = self.get_serializer(template, data=request.data, partial=partial)
        body.is_valid(raise_exception=True)
        template = services.update_template(template, **_as_launch(body.validated_data))
        return Response(self.get_serializer(template).data)

    def partial_update(self, request, pk=None):
        return self.update(request, pk, partial=True)

    def destroy(self, request, pk=None):
        services.delete_template(self._own())
        return Response(status=status.HTTP_204_NO_CONTENT)
