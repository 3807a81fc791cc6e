import shlex

from django import forms
from django.core.exceptions import ValidationError

from accounts.models import SshKey
from console import integers
from console.catalog import registries
from console.catalog.models import (
    Image,
    Region,
    RestartPolicy,
    Spec,
    command_errors,
    env_errors,
)
from console.instances import access, availability, placement, resizing, services
from console.instances.models import OnHostLoss


class SecretTextarea(forms.Textarea):
    """A textarea that never renders what was typed in it: a page shown again after an
    error holds no secret."""

    def format_value(self, value):
        return None


def parse_env(text: str) -> dict[str, str]:
    """NAME=value lines (blank lines skipped) as a dict; a field error for a line without =."""
    env = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        name, equals, value = line.partition("=")
        if not equals:
            raise forms.ValidationError(f"Line {number}: write NAME=value.")
        env[name.strip()] = value
    problems = env_errors(env)
    if problems:
        raise forms.ValidationError(problems)
    return env


class VolumePicksField(forms.Field):
    """The volumes ticked on the launch page (`volumes`, their ids), each with the mount path
    typed beside it (`mount_path_<id>`; empty: the launch's default). The form only collects
    them: which volume may be attached, and where, is the launch's to say (signals.launching,
    console/volumes), for the form as for the API."""

    widget = forms.MultipleHiddenInput

    def __init__(self, **kwargs):
        super().__init__(required=False, **kwargs)


class SpecChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, spec):
        return f"{spec.name} — ${spec.current_price().normalize():f}/h"


class LaunchForm(forms.Form):
    region = forms.ModelChoiceField(
        queryset=Region.objects.all(), to_field_name="code", empty_label=None
    )
    spec = SpecChoiceField(
        queryset=Spec.objects.filter(active=True)
        .select_related("gpu_model", "mig_profile")
        .prefetch_related("prices"),
        to_field_name="code",
        widget=forms.RadioSelect,
        label="Spec",
    )
    image = forms.ModelChoiceField(
        queryset=Image.objects.filter(active=True),
        to_field_name="name",
        empty_label=None,
        required=False,
    )
    image_ref = forms.CharField(
        max_length=registries.MAX_REFERENCE + 1,  # longer: refusal says the limit in words
        required=False,
        label="Or your own image",
        help_text="Optional: an image reference of your own instead of the catalog image, e.g. "
        f"{registries.EXAMPLE}; a private registry's credentials go under Registry credentials. "
        "It is pinned to its digest at the first pull.",
        widget=forms.TextInput(
            attrs={"autocomplete": "off", "spellcheck": "false", "placeholder": "registry/repo:tag"}
        ),
    )
    name = forms.CharField(
        max_length=63,
        required=False,
        help_text="Lowercase letters, digits and hyphens. Empty: a generated one, such as "
        "a100-quarter-brave-otter.",
        widget=forms.TextInput(
            attrs={"autocomplete": "off", "spellcheck": "false", "placeholder": "generated"}
        ),
    )
    disk_gib = integers.FormField(
        required=False,
        min_value=1,
        max_value=services.MAX_DISK_GIB,
        label="Disk (GiB)",
        help_text="Optional: its disk at /workspace, kept until it is terminated. Empty: the "
        "spec's; it can be bigger, never smaller.",
    )
    ports = forms.CharField(
        required=False,
        label="Web ports",
        help_text="Optional: ports its workload serves, to open through the console besides "
        "the image's; one PORT:NAME a line (8080:app).",
        widget=forms.Textarea(attrs={"rows": 2, "spellcheck": "false"}),
    )
    command = forms.CharField(
        required=False,
        max_length=20000,
        help_text="Optional: what to run instead of the image's default, split like a shell "
        "would (python train.py --epochs 3).",
        widget=forms.TextInput(attrs={"autocomplete": "off", "spellcheck": "false"}),
    )
    env = forms.CharField(
        required=False,
        label="Environment",
        help_text="Optional: one NAME=value a line, over the image's defaults. A name that says "
        "it holds a credential (HF_TOKEN, WANDB_API_KEY …) is kept as a secret.",
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
    )
    secret_env = forms.CharField(
        required=False,
        label="Secrets",
        help_text="Optional: one NAME=value a line, given to the container as environment, "
        "stored encrypted and never shown again (after an error, enter them again).",
        widget=SecretTextarea(attrs={"rows": 2, "spellcheck": "false", "autocomplete": "off"}),
    )

    restart_policy = forms.ChoiceField(
        choices=[("", "The image's default"), *RestartPolicy.choices],
        required=False,
        label="Restart policy",
        help_text="Whether it runs again after its workload exits (on failure: a non-zero exit) "
        "or its host is lost.",
    )
    on_host_loss = forms.ChoiceField(
        choices=OnHostLoss.choices,
        initial=OnHostLoss.KEEP_DISK,
        required=False,
        label="If its host is lost",
        help_text="A disk stays on its host: wait for the host, or run again elsewhere on a new, "
        "empty disk.",
    )

    volumes = VolumePicksField(label="Volumes")

    template_name = forms.CharField(
        max_length=80,
        required=False,
        label="Template name",
        help_text="To save this launch as a template instead of launching it.",
        widget=forms.TextInput(attrs={"autocomplete": "off"}),
    )

    ssh_keys = forms.ModelMultipleChoiceField(
        queryset=SshKey.objects.none(),
        to_field_name="name",
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label="SSH keys",
        help_text="The keys that open its shells (ssh, the terminal).",
    )

    def __init__(self, *args, membership=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.membership = membership
        keys = SshKey.objects.filter(membership=membership) if membership else SshKey.objects.none()
        self.fields["ssh_keys"].queryset = keys
        self.fields["ssh_keys"].initial = [key.name for key in keys]
        # no maxlength in the page: a browser would cut a longer name silently, and launch it
        self.fields["name"].widget.attrs.pop("maxlength", None)

    def clean(self):
        data = super().clean() or {}
        spec, region = data.get("spec"), data.get("region")
        disk_gib = data.get("disk_gib")
        if spec is not None and disk_gib is not None and disk_gib < spec.disk_gib:
            self.add_error(
                "disk_gib", f"{spec.name} comes with {spec.disk_gib} GiB: give at least that."
            )
        if data.get("image_ref"):  # a reference of the tenant's own replaces the catalog image
            data["image"] = None
            if region is not None and (refused := registries.refusal(data["image_ref"], region)):
                self.add_error("image_ref", refused)
        elif data.get("image") is None and "image" not in self.errors:
            self.add_error("image", "Choose an image, or give a reference of your own.")
        if spec is not None and region is not None and self.membership is not None:
            found = availability.Checker(self.membership.tenant.quota, region).of(spec)
            if not found.launchable:
                self.add_error("spec", f"{spec.name} cannot be launched: {found.detail}")
        image = data.get("image")
        if image is not None and region is not None:
            try:
                services.check_image_obtainable(image, region)
            except ValidationError as error:
                self.add_error(None, error)
        return data

    def clean_image_ref(self) -> str:
        return self.cleaned_data["image_ref"].strip()

    def clean_on_host_loss(self) -> str:
        return self.cleaned_data["on_host_loss"] or OnHostLoss.KEEP_DISK

    def clean_name(self) -> str | None:
        name = self.cleaned_data["name"].strip()
        if not name:
            return None  # launch_instance generates one
        if not services.NAME_PATTERN.fullmatch(name):
            raise forms.ValidationError(services.NAME_RULE)
        return name

    def clean_command(self) -> list[str] | None:
        line = self.cleaned_data["command"].strip()
        if not line:
            return None
        try:
            command = shlex.split(line)
        except ValueError as exc:
            raise forms.ValidationError(f"Cannot split this command line: {exc}.") from exc
        problems = command_errors(command)
        if problems:
            raise forms.ValidationError(problems)
        return command

    def clean_ports(self) -> list[dict]:
        ports = []
        for number, line in enumerate(self.cleaned_data["ports"].splitlines(), 1):
            if not line.strip():
                continue
            port, colon, name = line.strip().partition(":")
            try:
                port = integers.parse(port.strip(), minimum=1, maximum=65535)
            except integers.NotAWholeNumber:
                port = None
            if not colon or port is None or not name.strip():
                raise forms.ValidationError(f"Line {number}: write PORT:NAME, e.g. 8080:app.")
            ports.append({"port": port, "name": name.strip()})
        image = None if self.data.get("image_ref", "").strip() else self.cleaned_data.get("image")
        if ports and image is not None and (problems := access.launch_ports_errors(image, ports)):
            raise forms.ValidationError(problems)
        return ports

    def clean_env(self) -> dict[str, str]:
        return parse_env(self.cleaned_data["env"])

    def clean_volumes(self) -> list[dict]:
        """What launch_instance takes as `volumes`: each ticked volume once, by id, with its
        mount path (None: the default)."""
        picks = []
        for ref in dict.fromkeys(self.cleaned_data["volumes"] or []):
            path = self.data.get(f"mount_path_{ref}", "").strip()
            picks.append({"volume": ref, "mount_path": path or None})
        return picks

    def clean_secret_env(self) -> dict[str, str]:
        return parse_env(self.cleaned_data["secret_env"])


class ResizeOption:
    """A spec an instance can be resized to, and what that does to it (resizing.impacts)."""

    def __init__(self, spec: Spec, impact: str):
        self.spec = spec
        self.impact = impact

    @property
    def needs_stop(self) -> bool:
        return self.impact == resizing.STOP

    @property
    def needs_restart(self) -> bool:
        return self.impact == resizing.RESTART


def resize_options(instance) -> list[ResizeOption]:
    """The specs `instance` can be resized to: active, not its own, that some host of its
    region (or the host that holds its disk) could hold and that fit the tenant's quota on
    their own; each with what the resize does to it."""
    checker = availability.Checker(instance.tenant.quota, instance.region)
    host = instance.disk_host
    host_hardware = None
    if host is not None:
        host_hardware = placement.snapshot(instance.region_id, host_pks=[host.pk], empty=True)
    impact = resizing.impacts(instance)
    options = []
    for spec in (
        Spec.objects.filter(active=True)
        .exclude(pk=instance.spec_id)
        .select_related("gpu_model", "mig_profile")
        .prefetch_related("prices")
    ):
        if not checker.of(spec).launchable:
            continue
        if host_hardware is not None and not placement.fits_now(spec, host_hardware):
            continue
        options.append(ResizeOption(spec, impact(spec)))
    return options


class ResizeForm(forms.Form):
    spec = SpecChoiceField(
        queryset=Spec.objects.filter(active=True)
        .select_related("gpu_model")
        .prefetch_related("prices"),
        to_field_name="code",
        empty_label=None,
        label="New spec",
    )
    disk_gib = integers.FormField(
        required=False,
        min_value=1,
        max_value=services.MAX_DISK_GIB,
        label="Disk (GiB)",
        help_text="Kept as it is unless you give a bigger size; a disk never shrinks.",
    )
    # what the tenant agreed to on the confirm page: a restart or a stop (resizing.impacts)
    confirm = forms.ChoiceField(
        required=False,
        choices=[("", ""), (resizing.RESTART, "restart"), (resizing.STOP, "stop")],
        widget=forms.HiddenInput,
    )

    def __init__(self, *args, instance=None, **kwargs):
        super().__init__(*args, **kwargs)
        if instance is not None:
            self.fields["spec"].queryset = self.fields["spec"].queryset.exclude(pk=instance.spec_id)
            self.fields["disk_gib"].initial = instance.disk_gib
