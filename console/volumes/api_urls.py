from rest_framework.routers import DefaultRouter

from console.volumes.api import VolumeViewSet

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("volumes", VolumeViewSet, basename="volume")

urlpatterns = router.urls
