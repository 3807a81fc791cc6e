from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.routers import DefaultRouter

from accounts.api import SshKeyViewSet
from accounts.token_api import ApiTokenViewSet
from console.api.catalog import ImageViewSet, RegionViewSet, SpecViewSet
from console.api.quota import QuotaView
from console.audit.api import AuditEntryViewSet

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("specs", SpecViewSet, basename="spec")
router.register("images", ImageViewSet, basename="image")
router.register("regions", RegionViewSet, basename="region")
router.register("ssh-keys", SshKeyViewSet, basename="ssh-key")
router.register("tokens", ApiTokenViewSet, basename="api-token")
router.register("audit", AuditEntryViewSet, basename="audit")

urlpatterns = [
    path("", include(router.urls)),
    path("quota/", QuotaView.as_view(), name="quota"),
    path("", include("console.instances.api_urls")),
    path("", include("console.idle.api_urls")),
    path("", include("console.launch_templates.api_urls")),
    path("", include("console.registry_credentials.api_urls")),
    path("", include("billing.api_urls")),
    path("", include("console.snapshots.api_urls")),
    path("", include("console.volumes.api_urls")),
    path("", include("console.notifications.api_urls")),
    path("schema/", SpectacularAPIView.as_view(permission_classes=[]), name="schema"),
    path(
        "docs/",
        SpectacularSwaggerSplitView.as_view(url_name="schema", permission_classes=[]),
        name="api-docs",
    ),
]
