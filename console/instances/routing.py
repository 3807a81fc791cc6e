from django.urls import path, re_path

from console.instances.consumers import TenantEventsConsumer
from console.instances.relay import PortSocketConsumer, TerminalConsumer

websocket_urlpatterns = [
    path("ws/events/", TenantEventsConsumer.as_asgi()),
    path("ws/instances/<int:pk>/terminal/", TerminalConsumer.as_asgi()),
    re_path(
        r"^instances/(?P<pk>[0-9]+)/ports/(?P<port>[0-9]{1,5})/(?P<rest>.*)$",
        PortSocketConsumer.as_asgi(),
    ),
]
