from django.urls import path, re_path

from console.instances import port_origin, views

app_name = "instances"

urlpatterns = [
    path("", views.instance_list, name="list"),
    path("launch/", views.launch, name="launch"),
    path("launch/template/<int:template>/", views.launch_template, name="launch-template"),
    path("<int:pk>/save-template/", views.save_template, name="save-template"),
    path("<int:pk>/", views.detail, name="detail"),
    path("<int:pk>/terminate/", views.terminate, name="terminate"),
    re_path(r"^(?P<pk>[0-9]+)/(?P<action>stop|start|reboot|resize)/\Z", views.act, name="act"),
    # a web port: a grant for its own origin, and a redirect there (the same path on it)
    re_path(
        r"^(?P<pk>[0-9]+)/ports/(?P<port>[0-9]{1,5})(?:/.*)?\Z",
        port_origin.open_port,
        name="open-port",
    ),
]
