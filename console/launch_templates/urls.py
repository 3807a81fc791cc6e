from django.urls import path

from console.launch_templates import views

app_name = "launch_templates"

urlpatterns = [
    path("", views.template_list, name="list"),
    path("<int:pk>/delete/", views.delete, name="delete"),
]
