"""Every websocket route of the console, gathered in one place."""

from console.instances.routing import websocket_urlpatterns as instance_routes
from console.metrics.routing import websocket_urlpatterns as metrics_routes

websocket_urlpatterns = [*instance_routes, *metrics_routes]
