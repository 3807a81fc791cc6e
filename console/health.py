"""GET /healthz: the console's status; 503 when a component is down, "degraded" (200) while
some host's agent is not heard or no host is registered. Each component's details (host names,
database vendor, broker kind, errors) go only to a staff session or a monitoring client that
sends `Authorization: Bearer <HEALTHZ_TOKEN>`: anyone else gets the status alone."""

import asyncio
import hmac
from datetime import timedelta
from importlib import import_module

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth import get_user
from django.db import connection
from django.http import JsonResponse
from django.utils import timezone
from django.views.decorators.http import require_GET

from console.fleet.models import Host


def _database() -> dict:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return {"status": "ok", "vendor": connection.vendor}


def _broker() -> dict:
    from console.celery import app

    if settings.CELERY_BROKER_URL.startswith("memory://"):
        return {"status": "ok", "kind": "in-process"}
    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, timeout=2)
    return {"status": "ok", "kind": conn.transport_cls}


def _channel_layer() -> dict:
    layer = get_channel_layer()

    async def roundtrip():
        # A pub/sub layer subscribes a new channel without waiting for the server to confirm,
        # so the first ping can pass before the subscription: ping again, with one receive
        # kept waiting throughout (cancelling a receive unsubscribes the channel).
        channel = await layer.new_channel()
        reply = asyncio.ensure_future(layer.receive(channel))
        try:
            for _ in range(8):
                await layer.send(channel, {"type": "health.ping"})
                done, _ = await asyncio.wait({reply}, timeout=0.25)
                if done:
                    return reply.result()
            raise TimeoutError("no ping came back from the channel layer within 2 s")
        finally:
            reply.cancel()

    async_to_sync(roundtrip)()
    return {"status": "ok", "kind": layer.__class__.__name__}


def _agents() -> dict:
    """The hosts whose agent was heard within the heartbeat grace. Any other, a host whose
    agent says its container engine does not answer, or no host registered at all (nothing
    could run), makes it "degraded", with the counts and names: still a 200, since the console
    itself serves (a load balancer must not take a web process out for a GPU host's silence)."""
    grace = timedelta(seconds=settings.HOST_HEARTBEAT_GRACE_SECONDS)
    hosts = Host.objects.exclude(status=Host.Status.RETIRED)
    silent = hosts.exclude(last_heartbeat_at__gte=timezone.now() - grace).order_by("name")
    total, unreachable = hosts.count(), list(silent.values_list("name", flat=True))
    engine_down = list(
        hosts.filter(engine_down_since__isnull=False)
        .exclude(name__in=unreachable)
        .order_by("name")
        .values_list("name", flat=True)
    )
    detail = (
        f"{total - len(unreachable)} of {total} hosts reachable"
        if total
        else "no hosts registered: no agent has registered a GPU host yet"
    )
    if engine_down:
        detail += f"; container engine down on {', '.join(engine_down)}"
    return {
        "status": "degraded" if unreachable or engine_down or not total else "ok",
        "hosts": total,
        "reachable": total - len(unreachable),
        "unreachable": unreachable,
        "engine_down": engine_down,
        "detail": detail,
    }


CHECKS = {"database": _database, "broker": _broker, "channel_layer": _channel_layer}


@require_GET
def healthz(request):
    components = {}
    for name, check in CHECKS.items():
        try:
            components[name] = check()
        except Exception as exc:  # noqa: BLE001 - any failure means the component is down
            components[name] = {"status": "down", "error": f"{exc.__class__.__name__}: {exc}"}
    if components["database"]["status"] == "ok":
        components["agents"] = _agents()
    statuses = {component["status"] for component in components.values()}
    status = "down" if "down" in statuses else "degraded" if "degraded" in statuses else "ok"
    body = (
        {"status": status, "components": components}
        if _may_see_details(request)
        else {"status": status}
    )
    return JsonResponse(body, status=503 if status == "down" else 200)


def _may_see_details(request) -> bool:
    """A monitoring token, or a staff member's session. This view answers before the session
    and authentication middleware run (see below), so it reads the session cookie itself."""
    token = settings.HEALTHZ_TOKEN
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer "):
        return hmac.compare_digest(header[len("Bearer ") :].strip().encode(), token.encode())
    session_key = request.COOKIES.get(settings.SESSION_COOKIE_NAME)
    if not session_key:
        return False
    request.session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    user = get_user(request)
    return user.is_active and user.is_staff


def serve_regardless_of_host(get_response):
    """Middleware: load balancers and probes ask for /healthz by address, whatever
    ALLOWED_HOSTS names, so it is answered before CommonMiddleware checks the Host header (it
    reads no cookie and builds no URL from the host)."""

    def middleware(request):
        if request.path_info == "/healthz":
            return healthz(request)
        return get_response(request)

    return middleware
