from django import forms
from django.contrib.auth import get_user_model

from accounts.roles import Role


class AddMemberForm(forms.Form):
    username = forms.CharField(max_length=150)
    role = forms.ChoiceField(choices=Role.choices, initial=Role.MEMBER)

    def clean_username(self):
        username = self.cleaned_data["username"].strip()
        user = get_user_model().objects.filter(username=username, is_active=True).first()
        if user is None:
            raise forms.ValidationError(f"No user named {username!r}.")
        self.cleaned_data["user"] = user
        return username


class SwitchTenantForm(forms.Form):
    tenant = forms.IntegerField(min_value=1, max_value=2**63 - 1)


class RoleForm(forms.Form):
    role = forms.ChoiceField(choices=Role.choices)


class TokenForm(forms.Form):
    name = forms.CharField(max_length=80, help_text="What will use it, e.g. 'ci-pipeline'.")
    expires_in_days = forms.TypedChoiceField(
        choices=[("", "Never"), ("7", "7 days"), ("30", "30 days"), ("90", "90 days")],
        coerce=int,
        empty_value=None,
        required=False,
        label="Expires",
    )
