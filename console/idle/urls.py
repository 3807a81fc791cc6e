from django.urls import path

from console.idle import views

app_name = "idle"

urlpatterns = [
    path("", views.tenant_policy, name="tenant"),
    path("instances/<int:pk>/policy/", views.instance_policy, name="instance-policy"),
    path("instances/<int:pk>/keep-running/", views.keep_running, name="keep-running"),
]
