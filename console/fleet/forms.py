from django import forms
from django.conf import settings

from console.catalog.models import Mode, Region
from console.fleet.models import Host
from console.fleet.services import JOIN_TOKEN_MAX_TTL_HOURS


class JoinTokenForm(forms.Form):
    region = forms.ModelChoiceField(queryset=Region.objects.all(), empty_label=None)
    note = forms.CharField(max_length=120, required=False, help_text="e.g. rack 4, node 12")
    ttl_hours = forms.IntegerField(
        min_value=1, max_value=JOIN_TOKEN_MAX_TTL_HOURS, label="Valid for (hours)", required=False
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["ttl_hours"].initial = settings.JOIN_TOKEN_TTL_HOURS


class HostStatusForm(forms.Form):
    status = forms.ChoiceField(choices=[(s.value, s.label) for s in Host.OPERATOR_STATUSES])


class GpuModeForm(forms.Form):
    mode = forms.ChoiceField(choices=Mode.choices)
