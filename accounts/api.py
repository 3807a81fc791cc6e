"""REST API of the caller's SSH keys in the tenant it acts in: /api/v1/ssh-keys/…"""

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.response import Response

from accounts import ssh_keys
from accounts.models import SshKey
from accounts.permissions import request_membership
from accounts.roles import OPERATE, READ


class SshKeySerializer(serializers.ModelSerializer):
    name = serializers.CharField(max_length=64)
    public_key = serializers.CharField(
        max_length=ssh_keys.MAX_KEY_CHARS,
        help_text="an OpenSSH public key line: ssh-ed25519, ecdsa-sha2-* or ssh-rsa (≥ 2048 bits)",
    )

    class Meta:
        model = SshKey
        fields = ["name", "public_key", "fingerprint", "created_at"]
        read_only_fields = ["fingerprint", "created_at"]


class SshKeyViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Your public SSH keys in this tenant: instances you launch grant them (all of them
    unless the launch names some), for `ssh` and the browser terminal. Adding keys needs the
    member role or above: a viewer never gets a shell."""

    serializer_class = SshKeySerializer
    lookup_field = "name"
    lookup_value_regex = "[^/]+"
    read_role = READ
    write_role = OPERATE
    api_scopes = {
        "list": "keys:read",
        "retrieve": "keys:read",
        "create": "keys:write",
        "destroy": "keys:write",
    }

    def get_queryset(self):
        return SshKey.objects.filter(membership=request_membership(self.request)).order_by("name")

    @extend_schema(request=SshKeySerializer, responses={201: SshKeySerializer})
    def create(self, request):
        body = SshKeySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        key = ssh_keys.add_ssh_key(
            request_membership(request),
            body.validated_data["name"],
            body.validated_data["public_key"],
        )
        return Response(SshKeySerializer(key).data, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance):
        ssh_keys.delete_ssh_key(instance)
