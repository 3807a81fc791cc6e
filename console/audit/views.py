"""The console's audit log page and its CSV: a tenant's admins and owners read their
tenant's entries."""

from django.core.paginator import Paginator
from django.http import StreamingHttpResponse
from django.shortcuts import render
from django.utils import timezone

from accounts.guards import tenant_view
from accounts.roles import MANAGE
from console import integers
from console.audit import queries

PAGE_SIZE = 50


def _entries(request):
    query = queries.AuditQuery(data=request.GET)
    entries = queries.visible(request.membership.tenant)
    if query.is_valid():
        data = {k: v for k, v in query.validated_data.items() if k != "tenant"}
        return query, queries.narrow(entries, data)
    return query, entries.none()


@tenant_view(MANAGE)
def audit_log(request):
    query, entries = _entries(request)
    page = Paginator(entries, PAGE_SIZE).get_page(integers.reference_id(request.GET.get("page")))
    filters = request.GET.copy()
    filters.pop("page", None)
    context = {
        "page": page,
        "errors": query.errors,
        "filters": {name: request.GET.get(name, "") for name in queries.FILTERS},
        "query_string": filters.urlencode(),
    }
    return render(request, "audit/log.html", context)


@tenant_view(MANAGE)
def audit_csv(request):
    _, entries = _entries(request)
    tenant = request.membership.tenant
    response = StreamingHttpResponse(queries.csv_lines(entries), content_type="text/csv")
    name = f"audit-{tenant.slug}-{timezone.now():%Y%m%d-%H%M%S}.csv"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response
