from django.urls import path

from console.instances.consumers import TenantEventsConsumer

websocket_urlpatterns = [
    path("ws/events/", TenantEventsConsumer.as_asgi()),
]
