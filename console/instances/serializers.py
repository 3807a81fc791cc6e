from datetime import UTC, datetime

from django.utils.functional import cached_property
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from console.catalog.models import MAX_ARGS, MAX_VALUE, Image, Region, Spec, env_errors
from console.instances import access, lifecycle, placement
from console.instances.models import Instance, InstanceEvent
from console.instances.services import MAX_DISK_GIB


class DiskSerializer(serializers.Serializer):
    size_gib = serializers.IntegerField()
    host = serializers.CharField(allow_null=True)


class SshSerializer(serializers.Serializer):
    host = serializers.CharField()
    port = serializers.IntegerField()
    user = serializers.CharField()
    command = serializers.CharField(help_text="the exact command line to paste")
    host_key_fingerprint = serializers.CharField(help_text="check it on first connect")


class PortSerializer(serializers.Serializer):
    port = serializers.IntegerField(min_value=1, max_value=65535)
    name = serializers.CharField(max_length=40)


class PortLinkSerializer(PortSerializer):
    url = serializers.URLField(help_text="through the console, for members of the tenant")


class InstanceSerializer(serializers.ModelSerializer):
    spec = serializers.SlugRelatedField(slug_field="code", read_only=True)
    image = serializers.SlugRelatedField(slug_field="name", read_only=True)
    region = serializers.SlugRelatedField(slug_field="code", read_only=True)
    gpu_equivalents = serializers.DecimalField(
        source="spec.gpu_equivalents", max_digits=8, decimal_places=3, normalize_output=True
    )
    price_per_hour = serializers.DecimalField(
        source="spec.current_price", max_digits=10, decimal_places=4, normalize_output=True
    )
    image_reference = serializers.CharField(source="image.reference", read_only=True)
    disk = serializers.SerializerMethodField()
    actions = serializers.SerializerMethodField()
    placement = serializers.SerializerMethodField()
    ssh = serializers.SerializerMethodField()
    ports = serializers.SerializerMethodField()
    ssh_keys = serializers.SerializerMethodField()

    class Meta:
        model = Instance
        fields = [
            "id",
            "name",
            "state",
            "state_reason",
            "spec",
            "image",
            "image_reference",
            "command",
            "env",
            "exit_code",
            "disk",
            "ssh",
            "ssh_keys",
            "ports",
            "region",
            "gpu_equivalents",
            "price_per_hour",
            "actions",
            "created_at",
            "updated_at",
            "terminated_at",
            "placement",
        ]
        read_only_fields = fields

    @extend_schema_field(DiskSerializer)
    def get_disk(self, instance) -> dict:
        """Its disk: the size, and the host that holds it (null before its first start)."""
        host = instance.disk_host
        return {"size_gib": instance.disk_gib, "host": host.name if host else None}

    @extend_schema_field(SshSerializer(allow_null=True))
    def get_ssh(self, instance) -> dict | None:
        """How to ssh in (running, on a host with a gateway), for members with role member
        or above; null otherwise."""
        request = self.context.get("request")
        membership = getattr(request._request, "membership", None) if request else None
        if not access.shell_member(membership):
            return None
        return access.ssh_target(instance)

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_ssh_keys(self, instance) -> list[str]:
        """Names of the keys it grants ("username/name" for another member's)."""
        creator = instance.created_by_id
        return [
            key.name if key.membership.user_id == creator else
            f"{key.membership.user.username}/{key.name}"
            for key in instance.ssh_keys.all()
        ]  # fmt: skip

    @extend_schema_field(PortLinkSerializer(many=True))
    def get_ports(self, instance) -> list[dict]:
        """Its web ports (the image's and the launch's), each proxied by the console."""
        request = self.context.get("request")
        links = []
        for entry in access.declared_ports(instance):
            path = access.port_path(instance, entry["port"])
            url = request.build_absolute_uri(path) if request else path
            links.append({"port": entry["port"], "name": entry["name"], "url": url})
        return links

    def get_actions(self, instance) -> list[str]:
        return lifecycle.allowed_actions(instance.state)

    def get_placement(self, instance) -> dict | None:
        """Host, GPUs and slice: operators (staff) only."""
        request = self.context.get("request")
        if request is None or not request.user.is_staff:
            return None
        current = next((a for a in instance.allocations.all() if a.released_at is None), None)
        return placement.describe(current) if current else None

    def to_representation(self, instance) -> dict:
        """The fields above, built directly, and each spec's figures once per response: on a
        list page DRF's field-by-field path costs more than the queries (bench/api.py)."""
        spec = instance.spec
        figures = self._spec_figures.get(spec.pk)
        if figures is None:
            price = spec.current_price()
            figures = self._spec_figures[spec.pk] = (
                self.fields["gpu_equivalents"].to_representation(spec.gpu_equivalents),
                None if price is None else self.fields["price_per_hour"].to_representation(price),
            )
        return {
            "id": instance.pk,
            "name": instance.name,
            "state": instance.state,
            "state_reason": instance.state_reason,
            "spec": spec.code,
            "image": instance.image.name,
            "image_reference": instance.image.reference,
            "command": instance.command,
            "env": instance.env,
            "exit_code": instance.exit_code,
            "disk": self.get_disk(instance),
            "ssh": self.get_ssh(instance),
            "ssh_keys": self.get_ssh_keys(instance),
            "ports": self.get_ports(instance),
            "region": instance.region.code,
            "gpu_equivalents": figures[0],
            "price_per_hour": figures[1],
            "actions": self.get_actions(instance),
            "created_at": _timestamp(instance.created_at),
            "updated_at": _timestamp(instance.updated_at),
            "terminated_at": _timestamp(instance.terminated_at),
            "placement": self.get_placement(instance),
        }

    @cached_property
    def _spec_figures(self) -> dict:
        return {}


def _timestamp(value: datetime | None) -> str | None:
    """As DRF writes a DateTimeField (TIME_ZONE is UTC): ISO 8601, "Z" for UTC."""
    if value is None:
        return None
    text = value.astimezone(UTC).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


class LaunchSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=63)
    spec = serializers.SlugRelatedField(slug_field="code", queryset=Spec.objects.all())
    image = serializers.SlugRelatedField(slug_field="name", queryset=Image.objects.all())
    region = serializers.SlugRelatedField(
        slug_field="code", queryset=Region.objects.all(), required=False, allow_null=True
    )
    command = serializers.ListField(
        child=serializers.CharField(max_length=MAX_VALUE, allow_blank=True, trim_whitespace=False),
        min_length=1,
        max_length=MAX_ARGS,
        required=False,
        allow_null=True,
        help_text="What the workload runs instead of the image's default command.",
    )
    env = serializers.DictField(
        child=serializers.CharField(max_length=MAX_VALUE, allow_blank=True, trim_whitespace=False),
        required=False,
        help_text="Environment variables, laid over the image's defaults.",
    )

    ssh_keys = serializers.ListField(
        child=serializers.CharField(max_length=200),
        max_length=100,
        required=False,
        allow_null=True,
        help_text="Names of your SSH keys that open its shells (another member's: "
        '"username/name"). Default: all of your keys in this tenant.',
    )
    ports = PortSerializer(
        many=True,
        required=False,
        max_length=access.MAX_PORTS,
        help_text='Web ports to proxy besides the image\'s, e.g. [{"port": 8080, "name": "app"}].',
    )

    def validate_env(self, env):
        problems = env_errors(env)
        if problems:
            raise serializers.ValidationError(problems)
        return env


class LogsSerializer(serializers.Serializer):
    instance = serializers.IntegerField()
    lines = serializers.ListField(child=serializers.CharField())


class ResizeSerializer(serializers.Serializer):
    spec = serializers.SlugRelatedField(slug_field="code", queryset=Spec.objects.all())
    disk_gib = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_DISK_GIB,
        help_text="A bigger disk; default: the disk stays as it is (it never shrinks).",
    )
    allow_stop = serializers.BooleanField(
        default=True,
        help_text="Whether a running instance may be stopped (and started again) when its GPU "
        "has no room for the new spec; false: 409 needs_stop instead.",
    )


class InstanceEventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_label")
    kind = serializers.SerializerMethodField()

    class Meta:
        model = InstanceEvent
        fields = ["at", "actor", "kind", "from_state", "to_state", "message"]

    # a plain string in the schema: an enum named "kind" would collide with the invoices' one
    @extend_schema_field(serializers.CharField(help_text="created, transition or note"))
    def get_kind(self, event) -> str:
        """created (its first event), transition (a change of state), or note (no change
        of state: a resize while stopped, an ssh session; from_state is its state then)."""
        return event.kind
