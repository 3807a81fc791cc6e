import gc
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

from a2wsgi import WSGIMiddleware  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.wsgi import get_wsgi_application  # noqa: E402

from console import state_dir  # noqa: E402

state_dir.prepare()

# Django's pages and API are synchronous: each request runs whole, middleware and view, in one
# of settings.WEB_REQUEST_CONCURRENCY threads, the others wait their turn (none is refused).
# Django's own ASGI handler hops between the event loop and threads several times a request
# for synchronous middleware and views: 1.5 to 2.5 ms more CPU a request (bench/api.py).
django_app = WSGIMiddleware(get_wsgi_application(), workers=settings.WEB_REQUEST_CONCURRENCY)

from accounts.websocket import TenantAuthMiddleware  # noqa: E402
from console.instances.ports import by_host  # noqa: E402
from console.metrics.asgi import with_samples_route, with_samples_stream  # noqa: E402
from console.routing import websocket_urlpatterns  # noqa: E402

# The agents' sample pushes and streams, the ports and websockets do not wait behind Django's
# turns. A Host that names an instance's port origin (i{id}-{port}.PORTS_DOMAIN) is the port's,
# path and all; every other Host is the console's.
application = by_host(
    ProtocolTypeRouter(
        {
            "http": with_samples_route(django_app),
            "websocket": with_samples_stream(
                TenantAuthMiddleware(URLRouter(websocket_urlpatterns))
            ),
        }
    )
)

# Everything loaded so far (modules, settings, URL patterns, serializer and model classes) lives
# as long as the process: out of the collector's sight, a full collection of a web process no
# longer walks its ~170,000 objects, which took ~47 ms with every request's thread stopped; the
# list's p99 under 20 clients fell 312-334 -> 191-224 ms on PostgreSQL (bench/api.py).
gc.freeze()
