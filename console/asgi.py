import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from accounts.websocket import TenantAuthMiddleware  # noqa: E402
from console.instances.ports import with_ports_route  # noqa: E402
from console.metrics.asgi import with_samples_route  # noqa: E402
from console.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": with_ports_route(with_samples_route(django_asgi_app)),
        "websocket": TenantAuthMiddleware(URLRouter(websocket_urlpatterns)),
    }
)
