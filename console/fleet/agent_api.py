"""The API host agents call to join and stay: register (with a join token) and heartbeat
(with the host's secret). Every answer is JSON; a refusal is `{"code", "detail"}` (+
`errors`). Samples (console/metrics) and events (console/instances) come the same way."""

import ipaddress
import math
from datetime import UTC, datetime

from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, serializers, status
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.parsers import JSONParser
from rest_framework.permissions import BasePermission
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from console import integers
from console.catalog.models import Mode
from console.errors import ErrorCode
from console.fleet import images, services
from console.fleet.models import Host


class AgentPrincipal:
    """request.user of an agent's request: a host, not a person."""

    is_authenticated = True
    is_active = True
    is_staff = False
    is_superuser = False

    def __init__(self, host: Host):
        self.host = host

    def __str__(self) -> str:
        return f"agent of {self.host.name}"


class HostSecretAuthentication(BaseAuthentication):
    """`Authorization: Bearer <host secret>`. The secret's hash finds the host; the secret
    itself is then compared in constant time."""

    keyword = b"bearer"

    def authenticate(self, request):
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != self.keyword:
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed(
                "Authorization must be 'Bearer <host secret>'.", code=ErrorCode.INVALID_SECRET
            )
        try:
            secret = parts[1].decode("ascii")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed(
                "Invalid host secret.", code=ErrorCode.INVALID_SECRET
            ) from None
        host = services.host_for_secret(secret)
        if host is None:
            raise exceptions.AuthenticationFailed(
                "Invalid host secret.", code=ErrorCode.INVALID_SECRET
            )
        return AgentPrincipal(host), host

    def authenticate_header(self, request):
        return 'Bearer realm="agent"'


class IsAgent(BasePermission):
    def has_permission(self, request, view):
        return isinstance(request.auth, Host)


class SpeaksForItself(exceptions.PermissionDenied):
    default_code = ErrorCode.WRONG_HOST
    default_detail = "A host may only report for itself."


# --- body shapes --------------------------------------------------------------------------


class InventoryGpuSerializer(serializers.Serializer):
    """One GPU. A GPU the agent cannot read (fallen off the bus since it started) comes with
    no UUID or model: it must be unhealthy."""

    index = integers.Field(min_value=0, max_value=1023)
    uuid = serializers.CharField(max_length=80, allow_null=True)
    name = serializers.CharField(
        max_length=200, allow_blank=True, allow_null=True, required=False, default=""
    )
    model = serializers.CharField(max_length=40, allow_null=True)
    pci_bus_id = serializers.CharField(allow_blank=True, allow_null=True, required=False)
    memory_mib = integers.Field(min_value=0, allow_null=True, required=False)
    mode = serializers.ChoiceField(choices=Mode.values)
    mig_enabled = serializers.BooleanField(required=False, default=False)
    healthy = serializers.BooleanField()
    health_reason = serializers.CharField(allow_blank=True, allow_null=True, required=False)
    driver_version = serializers.CharField(allow_blank=True, allow_null=True, required=False)
    cuda_version = serializers.CharField(allow_blank=True, allow_null=True, required=False)
    mig_devices = serializers.ListField(child=serializers.DictField(), required=False, default=list)

    def validate(self, attrs):
        if attrs["uuid"] is None and attrs["healthy"]:
            raise serializers.ValidationError({"uuid": "A healthy GPU must have a UUID."})
        if attrs["uuid"] is not None and attrs["model"] is None:
            raise serializers.ValidationError({"model": "A readable GPU must have a model."})
        return attrs


class GatewayCertificateSerializer(serializers.Serializer):
    authority = serializers.RegexField(r"^SHA256:[A-Za-z0-9+/=]{1,80}\Z")
    valid_before = integers.Field(min_value=0, max_value=2**64 - 1)


class SshGatewaySerializer(serializers.Serializer):
    """The agent's SSH gateway: where it listens, its host key (and the key's fingerprint), and
    the host certificate it presents (whose CA, until when)."""

    port = integers.Field(min_value=1, max_value=65535)
    host_key_fingerprint = serializers.RegexField(r"^SHA256:[A-Za-z0-9+/=]{1,80}\Z")
    host_key = serializers.CharField(max_length=200, required=False, allow_blank=True)
    certificate = GatewayCertificateSerializer(required=False, allow_null=True, default=None)


class HeldImageSerializer(serializers.Serializer):
    """An image the host's engine holds (console/fleet/images.py)."""

    references = serializers.ListField(
        child=serializers.CharField(max_length=255), min_length=1, max_length=64
    )
    id = serializers.CharField(max_length=80)
    size = integers.Field(min_value=0)
    layers = serializers.ListField(
        child=serializers.CharField(max_length=80), max_length=512, required=False, default=list
    )


class ImageSettingsSerializer(serializers.Serializer):
    """The image settings the agent applies: what it pre-pulls, the mirror it pulls through."""

    pre_pull = serializers.ListField(child=serializers.CharField(max_length=255), max_length=100)
    mirror = serializers.CharField(max_length=255, allow_blank=True)
    # the registries it checks (absent from an agent one version behind)
    registries = serializers.ListField(
        child=serializers.CharField(max_length=255), max_length=50, required=False
    )


class RegistryCheckSerializer(serializers.Serializer):
    """Whether the host reaches a registry (agent/registry_probe.py), and why not."""

    registry = serializers.CharField(max_length=255)
    reachable = serializers.BooleanField()
    error = serializers.CharField(max_length=300, allow_blank=True, required=False, default="")
    checked_at = serializers.FloatField(min_value=0)


class PrePullSerializer(serializers.Serializer):
    reference = serializers.CharField(max_length=255)
    state = serializers.ChoiceField(choices=images.PRE_PULL_STATES)
    detail = serializers.CharField(max_length=300, allow_blank=True, required=False, default="")


class RoomMadeSerializer(serializers.Serializer):
    """The agent's last clean-up for room on the engine's disk."""

    at = integers.Field(min_value=0, max_value=2**40)
    removed = serializers.ListField(child=serializers.CharField(max_length=255), max_length=1000)
    freed_bytes = integers.Field(min_value=0)
    percent_before = serializers.FloatField(min_value=0, max_value=100)
    percent_after = serializers.FloatField(min_value=0, max_value=100, allow_null=True)


class ImageDiskSerializer(serializers.Serializer):
    """How full the agent lets the engine's disk get before it removes images, and the last
    time it did."""

    high_percent = integers.Field(min_value=1, max_value=100)
    low_percent = integers.Field(min_value=0, max_value=100)
    last_clean_up = RoomMadeSerializer(allow_null=True, required=False, default=None)


class InventorySerializer(serializers.Serializer):
    hostname = serializers.CharField(max_length=100, required=False, allow_blank=True)
    agent_version = serializers.CharField(max_length=40, required=False, allow_blank=True)
    backend = serializers.CharField(max_length=16, required=False, allow_blank=True)
    runtime = serializers.CharField(max_length=16, required=False, allow_blank=True)
    cpu_count = integers.Field(min_value=0, allow_null=True, required=False)
    memory_mib = integers.Field(min_value=0, allow_null=True, required=False)
    gpus = InventoryGpuSerializer(many=True)
    ssh = SshGatewaySerializer(required=False, allow_null=True, default=None)
    # an oci host's images (absent: its runtime holds none)
    images = HeldImageSerializer(many=True, required=False, default=list, max_length=1000)
    image_settings = ImageSettingsSerializer(required=False, default=None, allow_null=True)
    pre_pulls = PrePullSerializer(many=True, required=False, default=list, max_length=100)
    registries = RegistryCheckSerializer(many=True, required=False, default=list, max_length=50)
    image_disk = ImageDiskSerializer(required=False, default=None, allow_null=True)
    digest = serializers.CharField(max_length=64, required=False, allow_blank=True)
    # the subnets of the networks the agent's engine gives containers: no host's address may
    # lie in one (console/fleet/addresses.py)
    container_networks = serializers.ListField(
        child=serializers.CharField(max_length=50), required=False, default=list, max_length=1024
    )

    def validate_container_networks(self, subnets):
        for subnet in subnets:
            try:
                ipaddress.ip_network(subnet, strict=False)
            except ValueError:
                raise serializers.ValidationError(f"{subnet!r} is not a network") from None
        return subnets

    def validate_gpus(self, gpus):
        for key in ("index", "uuid"):
            values = [gpu[key] for gpu in gpus if gpu[key] is not None]
            if len(set(values)) != len(values):
                raise serializers.ValidationError(f"two GPUs share one {key}")
        return gpus


class RegisterSerializer(serializers.Serializer):
    join_token = serializers.CharField(max_length=200)
    hostname = serializers.CharField(max_length=100)
    address = serializers.CharField(max_length=200)
    region = serializers.CharField(max_length=40, required=False, allow_blank=True, default="")
    agent_version = serializers.CharField(
        max_length=40, required=False, allow_blank=True, default=""
    )
    inventory = InventorySerializer()


class EngineSerializer(serializers.Serializer):
    """Whether the agent's container engine answers: "up", or "down" since an epoch time (the
    agent's clock; record_heartbeat keeps it between the last heartbeat and now) with the
    engine's error."""

    state = serializers.ChoiceField(choices=["up", "down"])
    since = serializers.FloatField(required=False, min_value=0)
    detail = serializers.CharField(
        max_length=300, required=False, allow_blank=True, default="", trim_whitespace=True
    )

    def validate_since(self, since: float):
        if not math.isfinite(since) or since > 32503680000:  # before the year 3000
            raise serializers.ValidationError("must be a time in epoch seconds")
        return datetime.fromtimestamp(since, UTC)

    def validate_detail(self, detail: str) -> str:
        return "".join(c if c.isprintable() else " " for c in detail)

    def validate(self, attrs):
        if attrs["state"] == "down" and "since" not in attrs:
            raise serializers.ValidationError({"since": "an engine that is down says since when"})
        return attrs


class HeartbeatSerializer(serializers.Serializer):
    host_id = integers.Field()
    agent_version = serializers.CharField(
        max_length=40, required=False, allow_blank=True, default=""
    )
    inventory_digest = serializers.CharField(
        max_length=64, required=False, allow_blank=True, default=""
    )
    inventory = InventorySerializer(required=False, allow_null=True, default=None)
    # Where the agent says its API is: it never moves the host (only the operator or a new join
    # does); another address than the host's is a host event.
    address = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")

    def validate_address(self, address):
        if address and not services.valid_address(address):
            raise serializers.ValidationError("must be the agent's http(s) base URL")
        return address

    allocations = serializers.ListField(child=serializers.DictField(), required=False, default=list)
    engine = EngineSerializer(required=False, allow_null=True, default=None)


def validated(serializer_class, request) -> dict:
    if not isinstance(request.data, dict):
        raise exceptions.ParseError("The body must be a JSON object.")
    serializer = serializer_class(data=request.data)
    if not serializer.is_valid():
        detail = "; ".join(_flatten(serializer.errors))
        raise serializers.ValidationError({"non_field_errors": [detail], **serializer.errors})
    return serializer.validated_data


def _flatten(errors, where: str = "") -> list[str]:
    """`{"inventory": {"gpus": [{}, {"model": ["..."]}]}}` → `["inventory.gpus[1].model: ..."]`"""
    if isinstance(errors, dict):
        out = []
        for key, value in errors.items():
            if key == "non_field_errors":
                name = where
            elif isinstance(key, int):
                name = f"{where}[{key}]"
            else:
                name = f"{where}.{key}" if where else key
            out += _flatten(value, name)
        return out
    if isinstance(errors, list) and errors and all(isinstance(e, dict | list) for e in errors):
        return [m for n, e in enumerate(errors) for m in _flatten(e, f"{where}[{n}]")]
    if isinstance(errors, list):
        return [f"{where}: {e}" if where else str(e) for e in errors]
    return [f"{where}: {errors}" if where else str(errors)]


# --- views ----------------------------------------------------------------------------------


@extend_schema(exclude=True)  # the agents' protocol, not the tenants' API (ARCHITECTURE.md)
class AgentView(APIView):
    parser_classes = [JSONParser]
    renderer_classes = [JSONRenderer]
    authentication_classes = [HostSecretAuthentication]
    permission_classes = [IsAgent]

    def speaking_host(self, request, host_id: int) -> Host:
        host = request.auth
        if host_id != host.pk:
            raise SpeaksForItself(
                f"This secret belongs to host {host.pk} ({host.name}), not host {host_id}."
            )
        return host


@extend_schema(exclude=True)
class RegisterView(APIView):
    parser_classes = [JSONParser]
    renderer_classes = [JSONRenderer]
    authentication_classes: list = []
    permission_classes: list = []

    def post(self, request):
        data = validated(RegisterSerializer, request)
        try:
            host, secret = services.register_host(
                join_token=data["join_token"],
                hostname=data["hostname"],
                address=data["address"],
                remote_addr=request.META.get("REMOTE_ADDR") or "",
                region_code=data["region"],
                agent_version=data["agent_version"],
                inventory=data["inventory"],
            )
        except services.RegistrationRefused as refused:
            errors = {"errors": {refused.field: [refused.detail]}} if refused.field else {}
            body = {"code": refused.code, "detail": refused.detail, **errors}
            return Response(body, refused.status)
        return Response(
            {
                "host_id": host.pk,
                "secret": secret,
                "heartbeat_interval": services.heartbeat_interval(),
                "sample_interval": services.SAMPLE_INTERVAL_SECONDS,
            },
            status=status.HTTP_201_CREATED,
        )


class HeartbeatView(AgentView):
    def post(self, request):
        data = validated(HeartbeatSerializer, request)
        host = services.record_heartbeat(
            self.speaking_host(request, data["host_id"]),
            agent_version=data["agent_version"],
            inventory_digest=data["inventory_digest"],
            inventory=data["inventory"],
            address=data["address"],
            engine=data["engine"],
        )
        return Response(
            {
                "status": host.status,
                "inventory_digest": host.inventory_digest,
                "heartbeat_interval": services.heartbeat_interval(),
            }
        )
