"""The console's home page: the tenant's instances, quota and spend at a glance."""

from django.db.models import Count
from django.shortcuts import render

from accounts.guards import tenant_view
from billing.budgets import month_to_date
from console.instances.models import Instance, State
from console.instances.quota import usage


@tenant_view()
def dashboard(request):
    tenant = request.membership.tenant
    quota = tenant.quota
    used = usage(tenant)
    counts = dict(
        Instance.objects.filter(tenant=tenant)
        .exclude(state=State.TERMINATED)
        .values_list("state")
        .annotate(n=Count("pk"))
    )
    by_state = [(label, counts.get(value, 0), value) for value, label in State.choices]
    gpu_pct = int(used.gpu_used * 100 / quota.gpu_quota) if quota.gpu_quota else 0
    inst_pct = int(used.instances_used * 100 / quota.max_instances) if quota.max_instances else 0
    return render(
        request,
        "web/dashboard.html",
        {
            "quota": quota,
            "used": used,
            "spent": month_to_date(tenant),
            "gpu_pct": min(gpu_pct, 100),
            "inst_pct": min(inst_pct, 100),
            "by_state": [row for row in by_state if row[2] != State.TERMINATED],
            "recent": Instance.objects.filter(tenant=tenant)
            .exclude(state=State.TERMINATED)
            .select_related("spec", "region")[:8],
        },
    )
