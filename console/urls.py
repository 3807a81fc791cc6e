from django.contrib import admin
from django.urls import include, path

from console.health import healthz

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include("console.api.urls")),
    path("agent/v1/", include("console.agent_urls")),
    path("healthz", healthz, name="healthz"),
    path("", include("console.metrics.urls")),
    path("fleet/", include("console.fleet.urls")),
    path("instances/", include("console.instances.urls")),
    path("templates/", include("console.launch_templates.urls")),
    path("registry-credentials/", include("console.registry_credentials.urls")),
    path("snapshots/", include("console.snapshots.urls")),
    path("volumes/", include("console.volumes.urls")),
    path("idle/", include("console.idle.urls")),
    path("billing/", include("billing.urls")),
    path("notifications/", include("console.notifications.urls")),
    path("audit/", include("console.audit.urls")),
    path("", include("console.web.urls")),
    path("", include("accounts.urls")),
]

handler400 = "console.api.errors.api_bad_request"
handler404 = "console.api.errors.api_not_found"
handler500 = "console.api.errors.api_server_error"
