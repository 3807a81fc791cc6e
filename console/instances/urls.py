from django.urls import path, re_path

from console.instances import views

app_name = "instances"

urlpatterns = [
    path("", views.instance_list, name="list"),
    path("launch/", views.launch, name="launch"),
    path("<int:pk>/", views.detail, name="detail"),
    path("<int:pk>/terminate/", views.terminate, name="terminate"),
    re_path(r"^(?P<pk>[0-9]+)/(?P<action>stop|start|reboot|resize)/$", views.act, name="act"),
]
