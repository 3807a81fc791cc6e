from django.urls import path

from console.metrics import consumers

websocket_urlpatterns = [
    path(
        "ws/instances/<int:instance_id>/metrics/",
        consumers.InstanceMetricsConsumer.as_asgi(),
        name="ws-instance-metrics",
    ),
    path("ws/metrics/", consumers.TenantMetricsConsumer.as_asgi(), name="ws-tenant-metrics"),
    path("ws/fleet/metrics/", consumers.FleetMetricsConsumer.as_asgi(), name="ws-fleet-metrics"),
    path(
        "ws/fleet/hosts/<int:host_id>/metrics/",
        consumers.HostMetricsConsumer.as_asgi(),
        name="ws-host-metrics",
    ),
]
