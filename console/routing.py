"""Every websocket route of the console, gathered in one place, each consumer's clients counted
(console.socket_census); a path no route takes is closed (4404), as a page that is not there
answers 404, rather than failing the handshake with a server error."""

import copy

from channels.generic.websocket import AsyncWebsocketConsumer
from django.urls import re_path

from console.instances.routing import websocket_urlpatterns as instance_routes
from console.metrics.routing import websocket_urlpatterns as metrics_routes
from console.socket_census import counted

NOT_FOUND = 4404


class NoSuchSocket(AsyncWebsocketConsumer):
    async def connect(self):
        await self.accept()
        await self.close(code=NOT_FOUND, reason="No such websocket.")


def _counted(pattern):
    route = copy.copy(pattern)
    route.callback = counted(pattern.callback)
    return route


websocket_urlpatterns = [
    *(_counted(p) for p in (*instance_routes, *metrics_routes)),
    re_path(r"", NoSuchSocket.as_asgi()),
]
