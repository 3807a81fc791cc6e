from django.urls import path

from console.volumes import views

app_name = "volumes"

urlpatterns = [
    path("", views.volumes, name="list"),
    path("create/", views.create, name="create"),
    path("<int:pk>/attach/", views.attach, name="attach"),
    path("<int:pk>/detach/", views.confirm, {"action": "detach"}, name="detach"),
    path("<int:pk>/delete/", views.confirm, {"action": "delete"}, name="delete"),
]
