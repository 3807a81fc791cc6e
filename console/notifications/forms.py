from django import forms

from console.notices import KINDS
from console.notifications.models import Endpoint

KIND_CHOICES = list(KINDS.items())


class EndpointForm(forms.Form):
    name = forms.CharField(max_length=64, help_text="e.g. on-call, #gpu-alerts")
    channel = forms.ChoiceField(choices=Endpoint.Channel.choices)
    target = forms.CharField(
        max_length=500,
        label="Address or URL",
        help_text="Email: an address. Slack-compatible and signed webhooks: an https:// URL.",
    )
    kinds = forms.MultipleChoiceField(
        choices=KIND_CHOICES, widget=forms.CheckboxSelectMultiple, label="Notify of"
    )
    enabled = forms.BooleanField(required=False, initial=True)


class EndpointEditForm(EndpointForm):
    """The channel of an endpoint stays what it was created as."""

    channel = None
