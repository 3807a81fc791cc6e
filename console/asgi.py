import asyncio
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402

from accounts.websocket import TenantAuthMiddleware  # noqa: E402
from console.instances.ports import with_ports_route  # noqa: E402
from console.metrics.asgi import with_samples_route  # noqa: E402
from console.routing import websocket_urlpatterns  # noqa: E402


def at_most(limit: int, app):
    """`app` handling `limit` requests at a time; the others wait their turn (not refused)."""
    turns = asyncio.Semaphore(limit)

    async def limited(scope, receive, send):
        async with turns:
            await app(scope, receive, send)

    return limited


# Django's requests take turns (settings.WEB_REQUEST_CONCURRENCY); the agents' sample pushes,
# the ports' proxy and websockets do not wait behind them.
application = ProtocolTypeRouter(
    {
        "http": with_ports_route(
            with_samples_route(at_most(settings.WEB_REQUEST_CONCURRENCY, django_asgi_app))
        ),
        "websocket": TenantAuthMiddleware(URLRouter(websocket_urlpatterns)),
    }
)
