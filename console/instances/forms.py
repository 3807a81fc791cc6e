from django import forms

from console.catalog.models import Image, Region, Spec


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
