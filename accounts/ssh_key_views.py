"""The console page of the member's SSH keys: list, add, delete."""

from django import forms
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from accounts import ssh_keys
from accounts.guards import tenant_view
from accounts.models import SshKey
from accounts.roles import OPERATE, READ


class SshKeyForm(forms.Form):
    name = forms.CharField(max_length=64, help_text="e.g. laptop")
    public_key = forms.CharField(
        max_length=ssh_keys.MAX_KEY_CHARS,
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
        help_text="The contents of ~/.ssh/id_ed25519.pub (never the private key).",
    )


@tenant_view(READ, write_needed=OPERATE)
def ssh_key_list(request):
    form = SshKeyForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            key = ssh_keys.add_ssh_key(
                request.membership, form.cleaned_data["name"], form.cleaned_data["public_key"]
            )
        except ValidationError as error:
            for field, errors in error.message_dict.items():
                form.add_error(field if field in form.fields else None, errors)
        else:
            messages.success(request, f"Key {key.name} added ({key.fingerprint}).")
            return redirect("ssh-keys")
    return render(
        request,
        "accounts/ssh_keys.html",
        {
            "form": form,
            "keys": SshKey.objects.filter(membership=request.membership),
            "can_add": request.membership.can(OPERATE),
        },
    )


@require_POST
@tenant_view(OPERATE)
def ssh_key_delete(request, pk):
    key = get_object_or_404(SshKey, pk=pk, membership=request.membership)
    ssh_keys.delete_ssh_key(key)
    messages.success(request, f"Key {key.name} deleted: it opens none of your instances now.")
    return redirect("ssh-keys")
