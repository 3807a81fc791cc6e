"""The console page of the tenant's registry credentials: list, add (or replace), remove.
Admins and owners only; the token or password is never shown again."""

from django import forms
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from accounts.guards import tenant_view
from accounts.roles import MANAGE
from console.registry_credentials import services
from console.registry_credentials.models import RegistryCredential


class CredentialForm(forms.Form):
    registry = forms.CharField(max_length=300, help_text="host[:port], e.g. ghcr.io")
    username = forms.CharField(max_length=300, strip=False)
    password = forms.CharField(
        max_length=services.MAX_SECRET + 1,
        strip=False,
        label="Token or password",
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
        help_text="Stored encrypted and never shown again; it replaces this registry's "
        "credential if there is one.",
    )


@tenant_view(MANAGE)
def credential_list(request):
    tenant = request.membership.tenant
    form = CredentialForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            credential = services.save_credential(tenant, actor=request.user, **form.cleaned_data)
        except ValidationError as error:
            for field, errors in error.message_dict.items():
                form.add_error(field if field in form.fields else None, errors)
        else:
            messages.success(
                request,
                f"Credential for {credential.registry} saved: launches pull from it as "
                f"{credential.username}.",
            )
            return redirect("registry_credentials:list")
    return render(
        request,
        "registry_credentials/list.html",
        {"form": form, "credentials": RegistryCredential.objects.filter(tenant=tenant)},
    )


@require_POST
@tenant_view(MANAGE)
def credential_delete(request, pk):
    credential = get_object_or_404(RegistryCredential, pk=pk, tenant=request.membership.tenant)
    services.remove_credential(credential)
    messages.success(request, f"Credential for {credential.registry} removed.")
    return redirect("registry_credentials:list")
