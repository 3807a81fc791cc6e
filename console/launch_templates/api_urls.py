from rest_framework.routers import DefaultRouter

from console.launch_templates.api import TemplateViewSet

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("templates", TemplateViewSet, basename="template")

urlpatterns = router.urls
