from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from console import integers, secret_env
from console.catalog import registries
from console.catalog.models import (
    MAX_ARGS,
    MAX_VALUE,
    Image,
    Region,
    RestartPolicy,
    Spec,
    env_errors,
)
from console.instances import access
from console.instances.models import InstanceEvent, OnHostLoss, State
from console.instances.pull_progress import PullSerializer
from console.instances.services import MAX_DISK_GIB


class DiskSerializer(serializers.Serializer):
    size_gib = serializers.IntegerField()
    host = serializers.CharField(allow_null=True)


class SshSerializer(serializers.Serializer):
    host = serializers.CharField(
        help_text="what ssh logs in to: `gpucloud` through the SSH front (proxy_jump), or the "
        "host's gateway"
    )
    port = serializers.IntegerField()
    user = serializers.CharField()
    proxy_jump = serializers.CharField(
        allow_null=True,
        help_text="ssh's -J (ProxyJump) through the SSH front, which routes to the instance's "
        "host of the moment; null: the line goes straight to the host's gateway",
    )
    command = serializers.CharField(
        help_text="the exact command line to paste; through the SSH front it stays the same when "
        "the instance moves to another host"
    )
    host_key_fingerprint = serializers.CharField(
        help_text="of the key ssh checks first (the front's, or the gateway's)"
    )
    known_hosts = serializers.ListField(
        child=serializers.CharField(),
        help_text="known_hosts lines that let ssh check whom it reaches: the front's key and "
        "`@cert-authority gpucloud …` for every host's gateway (or the gateway's own key)",
    )


class PortSerializer(serializers.Serializer):
    port = integers.Field(min_value=1, max_value=65535)
    name = serializers.CharField(max_length=40)


class PortLinkSerializer(PortSerializer):
    url = serializers.URLField(
        help_text="for a browser: the console hands a signed-in member a grant for the port's "
        "own origin and redirects there"
    )
    origin_url = serializers.URLField(
        help_text="the port's own origin (i{id}-{port}.PORTS_DOMAIN), for members of the "
        "tenant: a browser with a grant, an API client with its Bearer token"
    )


# An instance as the API shows it, for the schema: listing.represent builds it from rows.
class InstanceSerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    name = serializers.CharField(read_only=True)
    state = serializers.ChoiceField(choices=State.choices, read_only=True)
    state_reason = serializers.CharField(
        read_only=True, help_text="why it is in its state: a code (oom_killed, …) or words"
    )
    reason_text = serializers.CharField(
        read_only=True,
        help_text="state_reason in words: what happened and what to do (empty when none)",
    )
    pull_progress = PullSerializer(
        read_only=True,
        allow_null=True,
        help_text="while its image is pulled: layers and bytes done of total, and the seconds "
        "left at the rate so far (null when not known); null otherwise",
    )
    spec = serializers.CharField(read_only=True)
    image = serializers.CharField(read_only=True)
    image_reference = serializers.CharField(read_only=True)
    image_digest = serializers.CharField(
        read_only=True,
        help_text="the digest its own image reference is pinned to (sha256:…), which every "
        "start runs; empty for a catalog image or before the first pull",
    )
    command = serializers.JSONField(read_only=True, allow_null=True)
    env = serializers.JSONField(read_only=True)
    secret_env = serializers.DictField(
        child=serializers.CharField(),
        read_only=True,
        help_text=f'its secret variables\' names, each with "{secret_env.MASK}": the values are '
        "never shown",
    )
    exit_code = serializers.IntegerField(read_only=True, allow_null=True)
    restart_policy = serializers.ChoiceField(choices=RestartPolicy.choices, read_only=True)
    on_host_loss = serializers.ChoiceField(choices=OnHostLoss.choices, read_only=True)
    restart_count = serializers.IntegerField(
        read_only=True,
        help_text="consecutive restarts after its workload ended by itself (back to 1 after a "
        "run of 10 minutes)",
    )
    restart_at = serializers.DateTimeField(
        read_only=True, allow_null=True, help_text="when the next restart is due, while it waits"
    )
    restarting = serializers.CharField(
        read_only=True,
        allow_null=True,
        help_text='while it waits for a restart: "restarting in N s (restart 3, backoff)"',
    )
    disk = DiskSerializer(read_only=True, help_text="its size, and the host that holds it")
    ssh = SshSerializer(
        read_only=True,
        allow_null=True,
        help_text="how to ssh in (running, on a host with a gateway), for members with role "
        "member or above; null otherwise",
    )
    ssh_keys = serializers.ListField(
        child=serializers.CharField(),
        read_only=True,
        help_text='names of the keys it grants ("username/name" for another member\'s)',
    )
    ports = PortLinkSerializer(
        many=True, read_only=True, help_text="its web ports (the image's and the launch's)"
    )
    region = serializers.CharField(read_only=True)
    gpu_equivalents = serializers.DecimalField(max_digits=8, decimal_places=3)
    price_per_hour = serializers.DecimalField(max_digits=10, decimal_places=4)
    actions = serializers.ListField(child=serializers.CharField(), read_only=True)
    created_at = serializers.DateTimeField(read_only=True)
    updated_at = serializers.DateTimeField(read_only=True)
    terminated_at = serializers.DateTimeField(read_only=True, allow_null=True)
    placement = serializers.DictField(
        read_only=True, allow_null=True, help_text="Host, GPUs and slice: operators (staff) only."
    )


class SpecField(serializers.SlugRelatedField):
    """A spec by its code; an unknown code is answered with the codes there are."""

    def __init__(self, **kwargs):
        queryset = Spec.objects.select_related("gpu_model", "mig_profile")
        super().__init__(slug_field="code", queryset=queryset, **kwargs)

    def to_internal_value(self, data):
        try:
            return super().to_internal_value(data)
        except serializers.ValidationError:
            codes = Spec.objects.filter(active=True).order_by("code").values_list("code", flat=True)
            raise serializers.ValidationError(
                f"No spec {data}. Specs: {', '.join(codes) or '(none yet)'} "
                "(GET /api/v1/specs/ describes them)."
            ) from None


class VolumeMountSerializer(serializers.Serializer):
    volume = serializers.CharField(max_length=63, help_text="One of your volumes: its id or name.")
    mount_path = serializers.CharField(
        max_length=200,
        required=False,
        help_text="Where the container sees it (not /workspace, the instance's own disk, nor a "
        "system path). Default: /mnt/<its name>.",
    )


class TerminateSerializer(serializers.Serializer):
    keep_disk = serializers.BooleanField(
        default=False,
        help_text="Keep its own disk (/workspace) as a volume of yours, billed as one, instead "
        "of deleting it.",
    )


class LaunchSerializer(serializers.Serializer):
    template = serializers.CharField(
        max_length=80,
        required=False,
        help_text="A template's id or name (GET /api/v1/templates/): launches what it saved, "
        "each field given here over its own (env and secret_env by name).",
    )
    name = serializers.CharField(
        max_length=63,
        required=False,
        allow_blank=True,
        allow_null=True,
        help_text="Default: a generated one, its spec's code and two words (\"a100-quarter-"
        'brave-otter").',
    )
    spec = SpecField(required=False, help_text="A spec's code; required without a template.")
    image = serializers.SlugRelatedField(
        slug_field="name",
        queryset=Image.objects.all(),
        required=False,
        allow_null=True,
        help_text="An image's name. Default: the first active image by name, as the console's "
        "form preselects.",
    )
    image_ref = serializers.CharField(
        max_length=registries.MAX_REFERENCE + 1,  # longer: refusal says the limit in words
        required=False,
        allow_null=True,
        allow_blank=True,
        help_text="An image reference of your own instead of a catalog image (not both), e.g. "
        f"{registries.EXAMPLE}: the region decides which registries it may name; pinned to its "
        "digest at the first pull.",
    )
    disk_gib = integers.Field(
        required=False,
        allow_null=True,
        min_value=1,
        max_value=MAX_DISK_GIB,
        help_text="Its disk at /workspace; default and smallest: the spec's.",
    )
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
        help_text="Environment variables, laid over the image's defaults. A name that says it "
        "holds a credential (HF_TOKEN, WANDB_API_KEY, DB_PASSWORD …) is taken as a secret.",
    )
    secret_env = serializers.DictField(
        child=serializers.CharField(max_length=MAX_VALUE, allow_blank=True, trim_whitespace=False),
        required=False,
        help_text='Secret environment variables ({"HF_TOKEN": "hf_…"}): stored encrypted, '
        "given to the container, and never shown again (the instance shows each as "
        f'"{secret_env.MASK}").',
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
    restart_policy = serializers.ChoiceField(
        choices=RestartPolicy.choices,
        required=False,
        help_text="Whether it runs again after a failure (its host lost): never, on-failure, "
        "always. Default: its image's.",
    )
    on_host_loss = serializers.ChoiceField(
        choices=OnHostLoss.choices,
        required=False,
        help_text="When its host is lost: keep_disk (the default), it stays failed until the "
        "host (which holds its disk) returns; fresh_disk, it runs again on another host with a "
        "new, empty disk.",
    )
    volumes = VolumeMountSerializer(
        many=True,
        required=False,
        help_text='Volumes to attach, e.g. [{"volume": "data", "mount_path": "/data"}]: the '
        "instance runs on the host they live on.",
    )

    def validate_env(self, env):
        problems = env_errors(env)
        if problems:
            raise serializers.ValidationError(problems)
        return env

    def validate_secret_env(self, secrets):
        return self.validate_env(secrets)

    def validate_image_ref(self, reference):
        return (reference or "").strip() or None

    def validate(self, data):
        if data.get("image") is not None and data.get("image_ref"):
            raise serializers.ValidationError(
                {"image_ref": ["Give a catalog image or an image reference, not both."]}
            )
        if "spec" not in data and not data.get("template"):
            raise serializers.ValidationError({"spec": ["Give a spec, or a template."]})
        return data


class SaveTemplateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=80, help_text="the template's name")


class LogsSerializer(serializers.Serializer):
    instance = serializers.IntegerField()
    lines = serializers.ListField(child=serializers.CharField())


class ResizeSerializer(serializers.Serializer):
    spec = SpecField()
    disk_gib = integers.Field(
        required=False,
        min_value=1,
        max_value=MAX_DISK_GIB,
        help_text="A bigger disk; default: the disk stays as it is (it never shrinks).",
    )
    allow_restart = serializers.BooleanField(
        default=False,
        help_text="Whether a running instance may be restarted on its GPU as the new spec (its "
        "processes end) when the GPU slice changes or the disk grows; without it such a resize "
        "answers 400 on this field. A resize that only changes vCPUs and RAM applies live.",
    )
    allow_stop = serializers.BooleanField(
        default=False,
        help_text="Whether a running instance may be stopped and started again (wherever the "
        "new spec fits) when its GPU has no room for it, or the GPU model or mode changes; "
        "without it such a resize answers 400 on this field.",
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
