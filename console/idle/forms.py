from django import forms

from console import integers
from console.idle.models import TenantPolicy
from console.idle.serializers import POLICY_FIELDS


class PolicyForm(forms.ModelForm):
    """One level's policy, as the tenant's settings page and the instance page set it."""

    class Meta:
        model = TenantPolicy
        fields = POLICY_FIELDS
        field_classes = {"threshold_percent": integers.FormField}
