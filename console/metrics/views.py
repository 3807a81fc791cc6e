"""Pages and plain endpoints of live metrics: /metrics (Prometheus), an instance's charts, the
operators' fleet heatmap and a host's GPU charts."""

from django.http import HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from accounts.guards import staff_view, tenant_view
from accounts.roles import READ
from console.errors import ErrorCode
from console.fleet.models import Host
from console.instances.models import Instance
from console.metrics import history
from console.metrics.ingest import gpu_series
from console.metrics.operations import OperationsCollector
from console.metrics.prometheus import LiveCollector, scrape_allowed


@require_GET
def prometheus_metrics(request):
    if not scrape_allowed(request):
        return HttpResponse(
            "403 Forbidden: /metrics needs 'Authorization: Bearer <METRICS_SCRAPE_TOKEN>' or a "
            "client address in METRICS_ALLOWED_IPS.\n",
            status=403,
            content_type="text/plain; charset=utf-8",
        )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LiveCollector())
    registry.register(OperationsCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_PLAIN_0_0_4)


@tenant_view(READ)
def instance_charts(request, pk: int):
    """An instance's live charts on a page of their own (the instance page includes the same
    `metrics/instance_charts.html`)."""
    instance = get_object_or_404(Instance, pk=pk, tenant=request.membership.tenant)
    return render(request, "metrics/instance.html", {"instance": instance})


@staff_view
def fleet_heatmap(request):
    return render(request, "metrics/fleet.html")


@staff_view
def host_charts(request, pk: int):
    host = get_object_or_404(Host.objects.select_related("region"), pk=pk)
    return render(request, "metrics/host.html", {"host": host, "gpus": host.gpus.order_by("index")})


@staff_view
@require_GET
def host_history(request, pk: int):
    """{"host", "range", "gpus": {index: chart data}} of a host's GPUs."""
    host = get_object_or_404(Host, pk=pk)
    name = request.GET.get("range", "10m")
    if name not in history.RANGES:
        return JsonResponse(
            {
                "code": ErrorCode.INVALID_RANGE,
                "detail": f"range must be one of {', '.join(history.RANGES)}",
            },
            status=400,
        )
    indices = host.gpus.order_by("index").values_list("index", flat=True)
    gpus = {str(i): history.chart_data(gpu_series(host.pk, i), name) for i in indices}
    return JsonResponse({"host": host.pk, "range": name, "gpus": gpus})
