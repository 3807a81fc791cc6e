from rest_framework import serializers

from console.notices import KINDS
from console.notifications.models import Attempt, Endpoint


class EndpointSerializer(serializers.ModelSerializer):
    kinds = serializers.ListField(
        child=serializers.ChoiceField(choices=list(KINDS)),
        allow_empty=False,
        help_text="the kinds of notice this endpoint receives",
    )
    target = serializers.CharField(
        max_length=500,
        help_text="email: an address; slack and webhook: the https:// URL notices are POSTed to",
    )
    secret_rotated_until = serializers.DateTimeField(
        source="previous_secret_expires_at",
        read_only=True,
        help_text="until when the secret a rotation replaced still signs (webhooks)",
    )

    class Meta:
        model = Endpoint
        fields = [
            "id",
            "name",
            "channel",
            "target",
            "kinds",
            "enabled",
            "secret_rotated_until",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["id", "created_at", "updated_at"]


class EndpointUpdateSerializer(EndpointSerializer):
    class Meta(EndpointSerializer.Meta):
        read_only_fields = [*EndpointSerializer.Meta.read_only_fields, "channel"]


class EndpointWithSecretSerializer(EndpointSerializer):
    secret = serializers.CharField(
        read_only=True,
        allow_null=True,
        help_text="webhooks: the signing secret, shown this once (null for other channels)",
    )

    class Meta(EndpointSerializer.Meta):
        fields = [*EndpointSerializer.Meta.fields, "secret"]


class RotatedSecretSerializer(serializers.Serializer):
    secret = serializers.CharField(help_text="the new signing secret, shown this once")
    previous_valid_until = serializers.DateTimeField(
        help_text="until when the replaced secret still signs each delivery too"
    )


class AttemptSerializer(serializers.ModelSerializer):
    event_id = serializers.UUIDField(source="delivery.notice.event_id")
    kind = serializers.CharField(source="delivery.notice.kind")
    delivery_state = serializers.CharField(source="delivery.state")

    class Meta:
        model = Attempt
        fields = [
            "id",
            "event_id",
            "kind",
            "number",
            "at",
            "ok",
            "status_code",
            "latency_ms",
            "response_excerpt",
            "error",
            "delivery_state",
        ]


class TestDeliverySerializer(serializers.Serializer):
    delivery = serializers.IntegerField(help_text="the test delivery's id")
    detail = serializers.CharField()
