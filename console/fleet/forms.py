import shlex

from django import forms
from django.conf import settings
from django.core.validators import RegexValidator

from console import integers
from console.catalog.models import GpuModel, Mode, Region
from console.fleet.models import Host
from console.fleet.services import JOIN_TOKEN_MAX_TTL_HOURS


class JoinTokenForm(forms.Form):
    region = forms.ModelChoiceField(queryset=Region.objects.all(), empty_label=None)
    note = forms.CharField(max_length=120, required=False, help_text="e.g. rack 4, node 12")
    ttl_hours = integers.FormField(
        min_value=1, max_value=JOIN_TOKEN_MAX_TTL_HOURS, label="Valid for (hours)", required=False
    )

    # How the new host's agent is to run: they make the command shown with the token (not
    # stored). Left out, each is its initial value.
    backend = forms.ChoiceField(
        choices=[("nvml", "nvml (real GPUs)"), ("sim", "sim (simulated GPUs)")],
        initial="nvml",
        required=False,
    )
    runtime = forms.ChoiceField(
        choices=[("oci", "oci (containers)"), ("process", "process (plain processes)")],
        initial="oci",
        required=False,
    )
    address = forms.CharField(
        max_length=253,
        initial="gpu-host-1",
        required=False,
        validators=[RegexValidator(r"^[A-Za-z0-9.-]+\Z", "A host name or IPv4 address.")],
        help_text="the new host's name or address, as the console reaches it",
    )
    port = integers.FormField(min_value=1, max_value=65535, initial=9101, required=False)
    ssh_port = integers.FormField(min_value=1, max_value=65535, initial=2222, required=False)
    state_dir = forms.CharField(
        max_length=200,
        initial="/var/lib/gpucloud-agent",
        required=False,
        validators=[RegexValidator(r"^/[A-Za-z0-9._/-]*\Z", "An absolute path.")],
    )
    gpus = integers.FormField(min_value=1, max_value=64, initial=8, required=False)
    model = forms.ChoiceField(
        choices=lambda: [(code, code) for code in GpuModel.objects.values_list("code", flat=True)],
        initial="a100-80gb",
        required=False,
    )
    COMMAND_FIELDS = ("backend", "runtime", "address", "port", "ssh_port", "state_dir", "gpus")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["ttl_hours"].initial = settings.JOIN_TOKEN_TTL_HOURS

    def clean(self):
        data = super().clean()
        for name in (*self.COMMAND_FIELDS, "model"):
            if data.get(name) in (None, ""):
                data[name] = self.fields[name].initial
        return data

    def command(self, server: str, token: str) -> str:
        """The new host's command line that joins it with `token` to the console at `server`:
        one shell command, its lines continued with a backslash."""
        data = self.cleaned_data
        lines = [
            ["gpucloud-agent", "--server", server],
            ["--join-token", token],
            ["--region", data["region"].code, "--backend", data["backend"]],
            ["--runtime", data["runtime"], "--state-dir", data["state_dir"]],
            ["--listen", f"0.0.0.0:{data['port']}"],
        ]
        lines[-1] += ["--advertise-url", f"http://{data['address']}:{data['port']}"]
        if data["backend"] == "sim":
            lines[2] += ["--gpus", str(data["gpus"]), "--model", data["model"]]
        if data["runtime"] == "oci":  # the SSH gateway into the containers
            lines.append(["--ssh-listen", f"0.0.0.0:{data['ssh_port']}"])
        return " \\\n  ".join(shlex.join(line) for line in lines)


class HostStatusForm(forms.Form):
    status = forms.ChoiceField(choices=[(s.value, s.label) for s in Host.OPERATOR_STATUSES])
    note = forms.CharField(
        max_length=Host._meta.get_field("operator_note").max_length,
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="shown to the tenants whose instances are on the host",
    )


class HostAddressForm(forms.Form):
    address = forms.CharField(
        max_length=Host._meta.get_field("address").max_length,
        help_text="the agent's API, as its --advertise-url says",
    )


class GpuModeForm(forms.Form):
    mode = forms.ChoiceField(choices=Mode.choices)
