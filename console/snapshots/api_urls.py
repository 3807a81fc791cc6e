from django.urls import path
from rest_framework.routers import DefaultRouter

from console.snapshots.api import RestoreViewSet, ScheduleViewSet, ShelveView, SnapshotViewSet

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("snapshots", SnapshotViewSet, basename="snapshot")
router.register("snapshot-schedules", ScheduleViewSet, basename="snapshot-schedule")
router.register("snapshot-restores", RestoreViewSet, basename="snapshot-restore")

urlpatterns = [
    path("instances/<int:pk>/shelve/", ShelveView.as_view(), name="instance-shelve"),
    *router.urls,
]
