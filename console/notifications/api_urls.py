from django.urls import include, path
from rest_framework.routers import DefaultRouter

from console.notifications.api import EndpointViewSet

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("notifications/endpoints", EndpointViewSet, basename="notification-endpoint")

urlpatterns = [path("", include(router.urls))]
