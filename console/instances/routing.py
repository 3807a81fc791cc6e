from django.urls import path

from console.instances.consumers import TenantEventsConsumer
from console.instances.relay import TerminalConsumer

websocket_urlpatterns = [
    path("ws/events/", TenantEventsConsumer.as_asgi()),
    path("ws/instances/<int:pk>/terminal/", TerminalConsumer.as_asgi()),
]
