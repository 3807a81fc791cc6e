from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.routers import DefaultRouter

from accounts.api import SshKeyViewSet
from console.api.catalog import ImageViewSet, RegionViewSet, SpecViewSet
from console.api.quota import QuotaView

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("specs", SpecViewSet, basename="spec")
router.register("images", ImageViewSet, basename="image")
router.register("regions", RegionViewSet, basename="region")
router.register("ssh-keys", SshKeyViewSet, basename="ssh-key")

urlpatterns = [
    path("", include(router.urls)),
    path("quota/", QuotaView.as_view(), name="quota"),
    path("", include("console.instances.api_urls")),
    path("", include("billing.api_urls")),
    path("schema/", SpectacularAPIView.as_view(permission_classes=[]), name="schema"),
    path(
        "docs/",
        SpectacularSwaggerSplitView.as_view(url_name="schema", permission_classes=[]),
        name="api-docs",
    ),
]
