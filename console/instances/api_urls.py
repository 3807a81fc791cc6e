from rest_framework.routers import DefaultRouter

from console.instances.api import InstanceViewSet

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("instances", InstanceViewSet, basename="instance")

urlpatterns = router.urls
