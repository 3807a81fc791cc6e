"""Console pages of launch templates: the list (the tenant's own and the published ones, each
launched in one click) and deleting one of the tenant's own."""

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from accounts.guards import tenant_view
from accounts.roles import OPERATE, READ
from console.launch_templates import services
from console.launch_templates.models import LaunchTemplate


@tenant_view(READ)
def template_list(request):
    tenant = request.membership.tenant
    templates = list(services.visible(tenant))
    return render(
        request,
        "launch_templates/list.html",
        {
            "own": [t for t in templates if t.tenant_id == tenant.pk],
            "published": [t for t in templates if t.tenant_id != tenant.pk],
            "can_operate": request.membership.can(OPERATE),
        },
    )


@require_POST
@tenant_view(OPERATE)
def delete(request, pk):
    template = get_object_or_404(LaunchTemplate, pk=pk, tenant=request.membership.tenant)
    services.delete_template(template)
    messages.success(request, f"Template {template.name} deleted.")
    return redirect("launch_templates:list")
