"""REST API of API tokens: /api/v1/tokens/… List (an admin's: everyone's in the tenant;
anyone else's: their own), create one for yourself (scoped, confined to a name prefix, with an
expiry), revoke one."""

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.parsers import JSONParser
from rest_framework.response import Response

from accounts import scopes as scope_rules
from accounts import services
from accounts.models import ApiToken
from accounts.permissions import request_membership
from accounts.roles import MANAGE, READ


class ApiTokenSerializer(serializers.ModelSerializer):
    user = serializers.CharField(source="user.username", read_only=True)
    prefix = serializers.SerializerMethodField(help_text="how the token starts: gpc_<prefix>_…")
    scopes = serializers.ListField(
        child=serializers.CharField(),
        allow_null=True,
        read_only=True,
        help_text="what it may do; null: whatever its user's role allows",
    )
    # a plain string in the schema: an enum named "state" would collide with the instances' one
    state = serializers.CharField(read_only=True, help_text="active, expired or revoked")

    class Meta:
        model = ApiToken
        fields = [
            "id", "name", "prefix", "user", "read_only", "scopes", "instance_prefix",
            "created_at", "last_used_at", "expires_at", "revoked_at", "state",
        ]  # fmt: skip
        read_only_fields = fields

    def get_prefix(self, token) -> str:
        return f"{ApiToken.PREFIX}_{token.prefix}_…"


class NewTokenSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=80)
    scopes = serializers.ListField(
        child=serializers.ChoiceField(scope_rules.CHOICES),
        required=False,
        allow_null=True,
        allow_empty=False,
        help_text="Scopes it holds (`instances:*` for all of a group). Default: none named, "
        "it may do whatever your role allows.",
    )
    instance_prefix = serializers.CharField(
        max_length=scope_rules.MAX_PREFIX,
        required=False,
        allow_blank=True,
        default="",
        help_text="It sees and acts on only the instances whose name starts with this, and "
        "launches only such names.",
    )
    expires_at = serializers.DateTimeField(required=False, allow_null=True)
    read_only = serializers.BooleanField(
        required=False, default=False, help_text="It acts as a viewer: reads only."
    )


class IssuedTokenSerializer(ApiTokenSerializer):
    token = serializers.CharField(read_only=True, help_text="the secret, shown only this once")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]
        read_only_fields = fields


class ApiTokenViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """API tokens in this tenant. Anyone creates tokens for themselves (a viewer's are
    read-only); a token created with a token never exceeds it. Revoking a token revokes the
    tokens it created too."""

    parser_classes = [JSONParser]  # "" is no expiry in a form, an error in JSON

    serializer_class = ApiTokenSerializer
    lookup_value_regex = "[0-9]+"
    read_role = READ
    write_role = READ
    api_scopes = {
        "list": "tokens:read",
        "retrieve": "tokens:read",
        "create": "tokens:write",
        "revoke": "tokens:write",
    }
    queryset = ApiToken.objects.none()  # typed path parameters in the schema

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return ApiToken.objects.none()
        membership = request_membership(self.request)
        tokens = ApiToken.objects.filter(tenant=membership.tenant).select_related("user")
        if not membership.can(MANAGE):
            tokens = tokens.filter(user=self.request.user)
        return tokens.order_by("-created_at", "-pk")

    @extend_schema(request=NewTokenSerializer, responses={201: IssuedTokenSerializer})
    def create(self, request):
        body = NewTokenSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        membership = request_membership(request)
        issued = services.issue_token(
            request.user,
            membership.tenant,
            body.validated_data["name"],
            body.validated_data.get("expires_at"),
            read_only=body.validated_data["read_only"],
            scopes=body.validated_data.get("scopes"),
            instance_prefix=body.validated_data["instance_prefix"],
            issuer=scope_rules.token_of(membership),
        )
        issued.token.token = issued.raw
        return Response(IssuedTokenSerializer(issued.token).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: ApiTokenSerializer})
    @action(detail=True, methods=["post"])
    def revoke(self, request, pk=None):
        """Revoke it (and the tokens it created); revoking a revoked token changes nothing."""
        token = services.revoke_token(self.get_object())
        return Response(ApiTokenSerializer(token).data)
