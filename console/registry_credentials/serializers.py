from rest_framework import serializers

from console.registry_credentials.models import RegistryCredential
from console.registry_credentials.services import MAX_SECRET


class RegistryCredentialSerializer(serializers.ModelSerializer):
    """A credential as anyone is shown it: never its token or password."""

    class Meta:
        model = RegistryCredential
        fields = ["id", "registry", "username", "created_at", "last_used_at"]
        read_only_fields = fields


class NewRegistryCredentialSerializer(serializers.Serializer):
    registry = serializers.CharField(
        max_length=300, help_text="The registry's host[:port], e.g. ghcr.io (no scheme)."
    )
    username = serializers.CharField(max_length=300, trim_whitespace=False)
    password = serializers.CharField(
        max_length=MAX_SECRET + 1,
        trim_whitespace=False,
        write_only=True,
        style={"input_type": "password"},
        help_text="The token or password: stored encrypted, never shown again. A credential "
        "for a registry that has one replaces it.",
    )
