"""Included at the root: /metrics (Prometheus), the metrics pages and the history API."""

from django.urls import path

from console.metrics import api, views

urlpatterns = [
    path("metrics", views.prometheus_metrics, name="prometheus-metrics"),
    path("metrics/fleet/", views.fleet_heatmap, name="metrics-fleet"),
    path("metrics/hosts/<int:pk>/", views.host_charts, name="metrics-host"),
    path("metrics/hosts/<int:pk>/history/", views.host_history, name="metrics-host-history"),
    path("metrics/instances/<int:pk>/", views.instance_charts, name="metrics-instance"),
    path(
        "api/v1/instances/<int:pk>/metrics/",
        api.InstanceMetricsView.as_view(),
        name="instance-metrics",
    ),
]
