from django.urls import path

from console.snapshots import views

app_name = "snapshots"

urlpatterns = [
    path("", views.snapshots, name="list"),
    path("take/", views.take, name="take"),
    path("<int:pk>/delete/", views.delete, name="delete"),
    path("<int:pk>/restore/", views.restore, name="restore"),
    path("schedules/", views.schedule, name="schedule"),
    path("schedules/<int:pk>/delete/", views.unschedule, name="unschedule"),
    path("shelve/<int:pk>/", views.shelve, name="shelve"),
]
