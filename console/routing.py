"""Every websocket route of the console, gathered in one place, each consumer's clients counted
(console.socket_census)."""

import copy

from console.instances.routing import websocket_urlpatterns as instance_routes
from console.metrics.routing import websocket_urlpatterns as metrics_routes
from console.socket_census import counted


def _counted(pattern):
    route = copy.copy(pattern)
    route.callback = counted(pattern.callback)
    return route


websocket_urlpatterns = [_counted(p) for p in (*instance_routes, *metrics_routes)]
