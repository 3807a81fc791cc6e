from rest_framework.routers import DefaultRouter

from console.registry_credentials.api import RegistryCredentialViewSet

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("registry-credentials", RegistryCredentialViewSet, basename="registrycredential")

urlpatterns = router.urls
