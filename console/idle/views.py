"""The idle policies' pages: the tenant's default (its settings page: admins change it), an
instance's own and keeping a warned instance running (forms on the instance page)."""

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from accounts.guards import tenant_view
from accounts.roles import MANAGE, OPERATE, READ
from console.audit import pages
from console.errors import DomainError
from console.idle import services
from console.idle.forms import PolicyForm
from console.idle.models import OperatorPolicy, TenantPolicy
from console.instances.models import Instance


def _changes(form: PolicyForm) -> dict:
    return {name: form.cleaned_data[name] for name in form.Meta.fields}


def _apply(request, form: PolicyForm, save) -> bool:
    """Save a valid form with `save(values)`; the operator's refusals become field errors."""
    if not form.is_valid():
        return False
    try:
        save(_changes(form))
    except ValidationError as error:
        for field, problems in error.message_dict.items():
            form.add_error(field if field in form.fields else None, problems)
        return False
    return True


@tenant_view(READ, write_needed=MANAGE)
def tenant_policy(request):
    tenant = request.membership.tenant
    current = TenantPolicy.objects.filter(tenant=tenant).first()
    form = PolicyForm(request.POST or None, instance=current)
    if request.method == "POST":
        if request.POST.get("clear"):
            services.clear_tenant_policy(tenant, actor=request.user)
            messages.success(request, "The tenant's idle policy is removed.")
            return redirect("idle:tenant")
        saved = _apply(
            request,
            form,
            lambda values: services.set_tenant_policy(tenant, values, actor=request.user),
        )
        if saved:
            messages.success(request, "The tenant's idle policy is saved.")
            return redirect("idle:tenant")
    operator = OperatorPolicy.objects.filter(tenant=tenant).first()
    context = {
        "form": form,
        "current": current,
        "operator": operator,
        "operator_summary": services.describe_policy(operator) if operator else "",
        "can_manage": request.membership.can(MANAGE),
    }
    return render(request, "idle/tenant.html", context)


def _instance(request, pk: int) -> Instance:
    return get_object_or_404(
        Instance.objects.filter(tenant=request.membership.tenant).select_related("tenant"), pk=pk
    )


@require_POST
@tenant_view(OPERATE)
def instance_policy(request, pk: int):
    instance = _instance(request, pk)
    if request.POST.get("clear"):
        services.clear_instance_policy(instance, actor=request.user)
        messages.success(request, f"{instance.name} has no idle policy of its own now.")
        return redirect("instances:detail", pk=pk)
    form = PolicyForm(request.POST)
    saved = _apply(
        request,
        form,
        lambda values: services.set_instance_policy(instance, values, actor=request.user),
    )
    if saved:
        messages.success(request, f"The idle policy of {instance.name} is saved.")
    else:
        problems = [f"{name}: {' '.join(errors)}" for name, errors in form.errors.items()]
        messages.error(request, "Not saved. " + " ".join(problems))
    return redirect("instances:detail", pk=pk)


@require_POST
@tenant_view(OPERATE)
def keep_running(request, pk: int):
    instance = _instance(request, pk)
    try:
        services.keep_running(instance, actor=request.user)
        messages.success(request, f"{instance.name} keeps running.")
    except DomainError as error:
        pages.refused(request, error.code, error.detail)
        messages.error(request, error.detail)
    return redirect("instances:detail", pk=pk)
