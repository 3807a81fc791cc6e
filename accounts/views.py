"""The console's account pages: switching tenant, members and invitations, API tokens."""

from datetime import timedelta
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth import login
from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from accounts import invitations, services
from accounts.forms import InviteForm, RoleForm, SignUpForm, SwitchTenantForm, TokenForm
from accounts.guards import tenant_view
from accounts.models import ApiToken, Invitation, Membership
from accounts.roles import MANAGE, OPERATE, Role
from accounts.tenancy import switch_tenant

NEW_TOKEN_KEY = "new_api_token"  # noqa: S105 - a session key, not a secret


def _error_text(error: ValidationError) -> str:
    return " ".join(error.messages)


@require_POST
def switch(request):
    if not request.user.is_authenticated:
        return redirect("login")
    form = SwitchTenantForm(request.POST)
    membership = switch_tenant(request, form.cleaned_data["tenant"]) if form.is_valid() else None
    if membership is None:
        messages.error(request, "You are not a member of that tenant.")
    else:
        messages.success(request, f"Now working in {membership.tenant.name}.")
    return redirect("dashboard")


@tenant_view(write_needed=MANAGE)
def members(request):
    """Lists members and open invitations; a POST invites an email address. The answer is the
    same whether or not the address has an account."""
    tenant = request.membership.tenant
    form = InviteForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        email, role = form.cleaned_data["email"], form.cleaned_data["role"]
        try:
            invitations.invite(
                request.membership,
                email,
                role,
                lambda raw: request.build_absolute_uri(reverse("invitation", args=[raw])),
            )
        except ValidationError as error:
            form.add_error(None, error)
        else:
            messages.success(request, f"Invitation to join as {role} sent to {email}.")
            return redirect("members")
    can_manage = request.membership.can(MANAGE)
    return render(
        request,
        "accounts/members.html",
        {
            "form": form,
            "memberships": Membership.objects.filter(tenant=tenant).select_related("user"),
            "invitations": invitations.pending(tenant) if can_manage else [],
            "roles": Role.choices,
            "can_manage": can_manage,
        },
    )


@require_POST
@tenant_view(MANAGE)
def invitation_revoke(request, pk):
    invitation = get_object_or_404(Invitation, pk=pk, tenant=request.membership.tenant)
    invitations.revoke(invitation)
    messages.success(request, f"Invitation of {invitation.email} revoked.")
    return redirect("members")


def invitation(request, token):
    """The link of an invitation email: a signed-in user with the invited address accepts
    with one click; a signed-out visitor signs in, or signs up when no account has it."""
    found = invitations.find(token)
    if found is None:
        return render(request, "accounts/invitation.html", {"state": "unknown"}, status=404)
    context = {"invitation": found, "state": found.state}
    refusal = invitations.refusal(found)
    if refusal:
        context.update(state="refused", refusal=refusal)
        return render(request, "accounts/invitation.html", context, status=410)
    if request.user.is_authenticated:
        return _accept_invitation(request, found, context)
    if invitations.has_account(found):
        login_url = f"{reverse('login')}?{urlencode({'next': request.path})}"
        return render(
            request,
            "accounts/invitation.html",
            {**context, "state": "sign_in", "login_url": login_url},
        )
    form = SignUpForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            membership = invitations.sign_up(
                found, form.cleaned_data["username"], form.cleaned_data["password"]
            )
        except ValidationError as error:
            form.add_error(None, error)
        else:
            login(request, membership.user, backend="django.contrib.auth.backends.ModelBackend")
            return _joined(request, membership)
    return render(
        request, "accounts/invitation.html", {**context, "state": "sign_up", "form": form}
    )


def _accept_invitation(request, found, context):
    if not invitations.is_for(found, request.user):
        return render(
            request, "accounts/invitation.html", {**context, "state": "other_user"}, status=403
        )
    if request.method == "POST":
        try:
            membership = invitations.accept(found, request.user)
        except ValidationError as error:
            context["error"] = _error_text(error)
        else:
            return _joined(request, membership)
    return render(request, "accounts/invitation.html", {**context, "state": "accept"})


def _joined(request, membership):
    switch_tenant(request, membership.tenant_id)
    messages.success(request, f"You joined {membership.tenant.name} as {membership.role}.")
    return redirect("dashboard")


@require_POST
@tenant_view(MANAGE)
def member_role(request, pk):
    membership = get_object_or_404(Membership, pk=pk, tenant=request.membership.tenant)
    form = RoleForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Unknown role.")
        return redirect("members")
    role = form.cleaned_data["role"]
    if Role.OWNER in (membership.role, role) and not request.membership.can(Role.OWNER):
        messages.error(request, "Only an owner can grant or take the owner role.")
        return redirect("members")
    try:
        services.change_role(membership, role)
    except ValidationError as error:
        messages.error(request, _error_text(error))
    else:
        messages.success(request, f"{membership.user.username} is now {membership.role}.")
    return redirect("members")


@require_POST
@tenant_view(MANAGE)
def member_remove(request, pk):
    membership = get_object_or_404(Membership, pk=pk, tenant=request.membership.tenant)
    if membership.role == Role.OWNER and not request.membership.can(Role.OWNER):
        messages.error(request, "Only an owner can remove an owner.")
        return redirect("members")
    try:
        services.remove_member(membership)
    except ValidationError as error:
        messages.error(request, _error_text(error))
    else:
        messages.success(request, f"{membership.user.username} removed.")
    return redirect("members")


@tenant_view()
def tokens(request):
    """Lists tokens (an admin's: everyone's; anyone else's: their own); a POST issues one
    for the signed-in user (a viewer's is read-only) and redirects, the secret riding along
    in the session for exactly one display (a reload neither shows it again nor issues
    another)."""
    tenant = request.membership.tenant
    form = TokenForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        days = form.cleaned_data["expires_in_days"]
        expires_at = timezone.now() + timedelta(days=days) if days else None
        try:
            issued = services.issue_token(
                request.user,
                tenant,
                form.cleaned_data["name"],
                expires_at,
                read_only=form.cleaned_data["read_only"],
                scopes=form.cleaned_data["scopes"] or None,
                instance_prefix=form.cleaned_data["instance_prefix"],
            )
        except ValidationError as error:
            messages.error(request, _error_text(error))
        else:
            request.session[NEW_TOKEN_KEY] = {"name": issued.token.name, "raw": issued.raw}
            return redirect("tokens")
    visible = ApiToken.objects.filter(tenant=tenant).select_related("user")
    if not request.membership.can(MANAGE):
        visible = visible.filter(user=request.user)
    return render(
        request,
        "accounts/tokens.html",
        {
            "form": form,
            "issued": request.session.pop(NEW_TOKEN_KEY, None),
            "tokens": visible,
            "can_manage": request.membership.can(MANAGE),
            "can_write": request.membership.can(OPERATE),
        },
    )


@require_POST
@tenant_view()
def token_revoke(request, pk):
    """Anyone revokes their own tokens; an admin anyone's in the tenant."""
    tokens = ApiToken.objects.filter(tenant=request.membership.tenant)
    if not request.membership.can(MANAGE):
        tokens = tokens.filter(user=request.user)
    token = get_object_or_404(tokens, pk=pk)
    services.revoke_token(token)
    messages.success(request, f"Token {token.name} revoked.")
    return redirect("tokens")
