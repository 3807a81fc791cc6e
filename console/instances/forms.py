import shlex

from django import forms

from accounts.models import SshKey
from console.catalog.models import Image, Region, Spec, command_errors, env_errors


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
        queryset=Image.objects.filter(active=True), to_field_name="name", empty_label=None
    )
    name = forms.CharField(
        max_length=63,
        help_text="Lowercase letters, digits and hyphens.",
        widget=forms.TextInput(attrs={"autocomplete": "off", "spellcheck": "false"}),
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
        help_text="Optional: one NAME=value a line, over the image's defaults.",
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
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
        keys = SshKey.objects.filter(membership=membership) if membership else SshKey.objects.none()
        self.fields["ssh_keys"].queryset = keys
        self.fields["ssh_keys"].initial = [key.name for key in keys]

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

    def clean_env(self) -> dict[str, str]:
        env = {}
        for number, line in enumerate(self.cleaned_data["env"].splitlines(), 1):
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


class ResizeForm(forms.Form):
    spec = SpecChoiceField(
        queryset=Spec.objects.filter(active=True)
        .select_related("gpu_model")
        .prefetch_related("prices"),
        to_field_name="code",
        empty_label=None,
        label="New spec",
    )

    def __init__(self, *args, instance=None, **kwargs):
        super().__init__(*args, **kwargs)
        if instance is not None:
            self.fields["spec"].queryset = self.fields["spec"].queryset.exclude(pk=instance.spec_id)
