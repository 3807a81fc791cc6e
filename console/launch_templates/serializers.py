from rest_framework import serializers

from console import integers, secret_env
from console.catalog.models import MAX_ARGS, MAX_VALUE, Image, Region, RestartPolicy, Spec
from console.launch_templates.models import ON_HOST_LOSS, LaunchTemplate
from console.launch_templates.services import MAX_DISK_GIB, MAX_PORTS


class TemplatePortSerializer(serializers.Serializer):
    port = integers.Field(min_value=1, max_value=65535)
    name = serializers.CharField(max_length=40)


class TemplateVolumeSerializer(serializers.Serializer):
    volume = serializers.CharField(max_length=63, help_text="One of your volumes: its name.")
    mount_path = serializers.CharField(
        max_length=200, required=False, help_text="Where the container sees it."
    )


def _env_field(help_text: str) -> serializers.DictField:
    return serializers.DictField(
        child=serializers.CharField(max_length=MAX_VALUE, allow_blank=True, trim_whitespace=False),
        required=False,
        help_text=help_text,
    )


class TemplateSerializer(serializers.ModelSerializer):
    """A template as the API shows it, and what a save or a change takes."""

    spec = serializers.SlugRelatedField(slug_field="code", queryset=Spec.objects.all())
    image = serializers.SlugRelatedField(
        slug_field="name", queryset=Image.objects.all(), required=False, allow_null=True,
        help_text="An image's name; null: the default image at launch.",
    )  # fmt: skip
    region = serializers.SlugRelatedField(
        slug_field="code", queryset=Region.objects.all(), required=False, allow_null=True,
        help_text="A region's code; null: where the spec fits at launch.",
    )  # fmt: skip
    command = serializers.ListField(
        child=serializers.CharField(max_length=MAX_VALUE, allow_blank=True, trim_whitespace=False),
        min_length=1, max_length=MAX_ARGS, required=False, allow_null=True,
        help_text="What the workload runs instead of the image's default command.",
    )  # fmt: skip
    env = _env_field(
        "Environment variables, laid over the image's defaults. A name that says it holds a "
        "credential (HF_TOKEN, WANDB_API_KEY …) is kept as a secret."
    )
    secret_env = _env_field(
        "Secret environment variables, stored encrypted and never shown again: each is shown "
        f'as "{secret_env.MASK}". On a change, the whole set: a value given as "{secret_env.MASK}" '
        "keeps the one stored under that name, a name left out is removed."
    )
    ports = TemplatePortSerializer(many=True, required=False, max_length=MAX_PORTS)
    disk_gib = integers.Field(
        required=False, allow_null=True, min_value=1, max_value=MAX_DISK_GIB,
        help_text="Its disk at /workspace; null: the spec's.",
    )  # fmt: skip
    restart_policy = serializers.ChoiceField(
        choices=RestartPolicy.choices, required=False, allow_blank=True,
        help_text="Empty: the image's.",
    )  # fmt: skip
    on_host_loss = serializers.ChoiceField(choices=ON_HOST_LOSS, required=False)
    volumes = TemplateVolumeSerializer(
        many=True, required=False, max_length=16,
        help_text="Volumes of yours to attach at launch (checked then).",
    )  # fmt: skip
    mine = serializers.SerializerMethodField(
        help_text="whether it is your tenant's (else an operator published it: read-only)"
    )

    class Meta:
        model = LaunchTemplate
        fields = [
            "id", "name", "description", "public", "mine", "spec", "image", "image_ref", "region",
            "command", "env", "secret_env", "ports", "disk_gib", "restart_policy", "on_host_loss",
            "volumes", "created_at", "updated_at",
        ]  # fmt: skip
        read_only_fields = ["public", "created_at", "updated_at"]

    def get_mine(self, template) -> bool:
        return template.tenant_id == self.context["tenant"].pk

    def to_representation(self, template):
        shown = super().to_representation(template)
        shown["secret_env"] = template.masked_secrets
        return shown
