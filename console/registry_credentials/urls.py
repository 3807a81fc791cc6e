from django.urls import path

from console.registry_credentials import views

app_name = "registry_credentials"

urlpatterns = [
    path("", views.credential_list, name="list"),
    path("<int:pk>/delete/", views.credential_delete, name="delete"),
]
