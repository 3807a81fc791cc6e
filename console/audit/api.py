"""REST API of the audit log: /api/v1/audit/… (read only)."""

from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import serializers, viewsets
from rest_framework.permissions import BasePermission

from accounts.models import ApiToken
from accounts.permissions import TenantRole, request_membership
from accounts.roles import MANAGE
from console.audit import queries
from console.audit.models import DONE, REFUSED, AuditEntry


class AuditEntrySerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)
    user = serializers.IntegerField(source="user_id", read_only=True, allow_null=True)
    token = serializers.IntegerField(source="token_id", read_only=True, allow_null=True)
    before = serializers.DictField(read_only=True, help_text="the changed fields as they were")
    after = serializers.DictField(
        read_only=True,
        help_text="the changed fields as they became; a refusal's: what it asked, secrets masked",
    )
    outcome = serializers.ChoiceField(
        choices=[DONE, REFUSED], read_only=True, help_text="done, or refused (see error_code)"
    )

    class Meta:
        model = AuditEntry
        fields = [
            "id",
            "at",
            "tenant",
            "actor",
            "user",
            "token",
            "address",
            "action",
            "object_type",
            "object_id",
            "object_repr",
            "before",
            "after",
            "outcome",
            "error_code",
            "error_message",
        ]
        read_only_fields = fields


def is_operator(request) -> bool:
    """An operator, signed in or by an API token limited by neither scopes nor a prefix (a
    limited token reads at most its own tenant's log, with audit:read)."""
    token = request.auth if isinstance(request.auth, ApiToken) else None
    if token is not None and (token.is_scoped or token.instance_prefix):
        return False
    return bool(request.user and request.user.is_authenticated and request.user.is_staff)


class ReadsTheLog(BasePermission):
    """Operators read every tenant's entries; a tenant's admins and owners read its own."""

    def has_permission(self, request, view):
        return is_operator(request) or TenantRole().has_permission(request, view)


@extend_schema_view(list=extend_schema(parameters=[queries.AuditQuery]))
class AuditEntryViewSet(viewsets.ReadOnlyModelViewSet):
    """Who changed what in the tenant, newest first: every launch, stop, resize, member,
    token, key, budget… with the fields it changed, its actor (user, API token, client
    address) and time. Tenant admins and owners read their tenant's; operators everyone's
    (narrowed with `tenant`). Nothing here can be changed."""

    serializer_class = AuditEntrySerializer
    permission_classes = [ReadsTheLog]
    lookup_value_regex = "[0-9]+"
    read_role = MANAGE
    write_role = MANAGE
    api_scopes = "audit:read"

    def get_queryset(self):
        if is_operator(self.request):
            entries = queries.visible()
        else:
            entries = queries.visible(request_membership(self.request).tenant)
        entries = entries.select_related("tenant")
        if self.action != "list":
            return entries
        # a plain dict: an empty value is an error here, not "left out" as in an HTML form
        query = queries.AuditQuery(data=self.request.query_params.dict())
        query.is_valid(raise_exception=True)
        data = query.validated_data
        if not is_operator(self.request):
            data.pop("tenant", None)
        return queries.narrow(entries, data)
