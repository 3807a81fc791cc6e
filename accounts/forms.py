from django import forms

from accounts import scopes as scope_rules
from accounts.roles import Role
from console import integers


class InviteForm(forms.Form):
    email = forms.EmailField(max_length=254)
    role = forms.ChoiceField(choices=Role.choices, initial=Role.MEMBER)


class SignUpForm(forms.Form):
    """An account for an invited address; the address is the invitation's."""

    username = forms.CharField(max_length=150)
    password = forms.CharField(widget=forms.PasswordInput, strip=False)
    password_again = forms.CharField(widget=forms.PasswordInput, strip=False)

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("password") != cleaned.get("password_again"):
            self.add_error("password_again", "The two passwords differ.")
        return cleaned


class SwitchTenantForm(forms.Form):
    tenant = integers.FormField(min_value=1)


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
    read_only = forms.BooleanField(
        required=False, label="Read only", help_text="It can list and read, never change."
    )
    scopes = forms.MultipleChoiceField(
        choices=[(scope.name, scope.label) for scope in scope_rules.SCOPES],
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Tick none for a token that may do whatever your role allows.",
    )
    instance_prefix = forms.CharField(
        max_length=scope_rules.MAX_PREFIX,
        required=False,
        label="Only instances named",
        help_text="e.g. ci-: it sees, acts on and launches only instances whose name starts "
        "with this.",
    )

    def scope_groups(self) -> list[tuple[str, list]]:
        """The scopes' checkboxes, by group (instances, metrics, billing …)."""
        boxes = {box.data["value"]: box for box in self["scopes"]}
        return [
            (group, [boxes[scope.name] for scope in scope_rules.SCOPES if scope.group == group])
            for group in scope_rules.GROUPS
        ]
