"""Where an instance's web port is served: an origin of its own, `i{id}-{port}.PORTS_DOMAIN`,
never the console's, so that nothing served there can read or act on the console.

A browser gets in with a grant: the console's view `open_port` (/instances/{id}/ports/{port}/…,
where the instance page's links point) mints a signed grant for exactly that instance, port
and membership, good for GRANT_SECONDS and once only, and redirects to the port origin's
GRANT_PATH, which turns it into a cookie of that origin alone (SESSION_COOKIE). Every request
and websocket there is checked again against the membership (console.instances.ports)."""

import re
import secrets
from urllib.parse import urlencode, urlsplit

from django.conf import settings
from django.core import signing
from django.core.cache import cache
from django.http import HttpResponseRedirect
from django.http.request import split_domain_port
from django.shortcuts import render

from accounts.guards import tenant_view
from accounts.roles import READ
from console.errors import ErrorCode
from console.instances import access

GRANT_PATH = "/.gpucloud/grant"
GRANT_SECONDS = 60
SESSION_SECONDS = 12 * 3600
_GRANT_SALT = "gpucloud.ports.grant"
_SESSION_SALT = "gpucloud.ports.session"


def cookie_name() -> str:
    """The port origin's own cookie: `__Host-` (Secure, host-only, Path=/) over HTTPS."""
    return "__Host-gpucloud-port" if settings.SESSION_COOKIE_SECURE else "gpucloud-port"


def _domain() -> tuple[str, str]:
    """PORTS_DOMAIN's name and port ("" for the console's own port)."""
    name, _, port = settings.PORTS_DOMAIN.lower().partition(":")
    return name, port


def parse_host(host: str) -> tuple[int, int] | None:
    """(instance id, port) when `host` (a Host header) names a port origin, else None."""
    name, _ = split_domain_port(host)
    found = re.fullmatch(rf"i([0-9]{{1,18}})-([0-9]{{1,5}})\.{re.escape(_domain()[0])}", name)
    return (int(found[1]), int(found[2])) if found else None


def origin_url(instance_id: int, port: int, console_url: str) -> str:
    """The port origin's root URL, on the scheme (and, unless PORTS_DOMAIN names one, the
    port) of `console_url`, the console's origin as its client reached it."""
    console = urlsplit(console_url)
    name, own_port = _domain()
    port_part = own_port or (str(console.port) if console.port else "")
    return f"{console.scheme}://i{instance_id}-{port}.{name}{':' if port_part else ''}{port_part}/"


def console_url(scheme: str, host: str) -> str:
    """The console's origin as seen from a port origin reached at `host` over `scheme`:
    CONSOLE_URL, else the first ALLOWED_HOSTS name on the same port (over HTTPS with HTTPS)."""
    if settings.CONSOLE_URL:
        return settings.CONSOLE_URL.rstrip("/")
    _, port = split_domain_port(host)
    scheme = "https" if settings.HTTPS else scheme
    return f"{scheme}://{settings.ALLOWED_HOSTS[0]}{':' if port else ''}{port}"


# --- grants and the port origin's session -------------------------------------------------


def mint_grant(instance_id: int, port: int, membership_id: int, console: str) -> str:
    payload = {
        "i": instance_id,
        "p": port,
        "m": membership_id,
        "c": console,
        "n": secrets.token_urlsafe(16),
    }
    return signing.dumps(payload, salt=_GRANT_SALT, compress=True)


def redeem_grant(raw: str, instance_id: int, port: int) -> dict | None:
    """The grant's payload when it is genuine, fresh, for this instance and port, and not
    used before (its nonce is taken here); None otherwise."""
    try:
        payload = signing.loads(raw, salt=_GRANT_SALT, max_age=GRANT_SECONDS)
    except signing.BadSignature:
        return None
    if (payload.get("i"), payload.get("p")) != (instance_id, port):
        return None
    if not cache.add(f"ports:grant:{payload['n']}", 1, timeout=GRANT_SECONDS + 5):
        return None  # replayed
    return payload


def session_value(grant: dict) -> str:
    """The cookie the port origin sets for a redeemed grant."""
    payload = {"i": grant["i"], "p": grant["p"], "m": grant["m"], "c": grant["c"]}
    return signing.dumps(payload, salt=_SESSION_SALT, compress=True)


def session_from(values: list[str], instance_id: int, port: int) -> dict | None:
    """The first of the port origin's cookie `values` that is genuine, not older than
    SESSION_SECONDS and for this instance and port (another origin may have tossed one)."""
    for value in values:
        try:
            payload = signing.loads(value, salt=_SESSION_SALT, max_age=SESSION_SECONDS)
        except signing.BadSignature:
            continue
        if (payload.get("i"), payload.get("p")) == (instance_id, port):
            return payload
    return None


def cookie_pairs(scope):
    """(name, value) of each cookie an ASGI request or websocket `scope` carries."""
    for name, value in scope["headers"]:
        if name == b"cookie":
            for pair in value.decode("latin-1").split(";"):
                key, _, val = pair.strip().partition("=")
                yield key, val


def app_headers(scope) -> list[tuple[str, str]]:
    """What the app gets beside the request's own headers: its cookies, never this origin's
    (the console's are host-only on the console's host: a browser sends none here), and the
    origin's host and scheme, which the agent hands the app as Host (X-Forwarded-Host,
    X-Forwarded-Proto)."""
    ours = cookie_name()
    kept = [f"{key}={value}" for key, value in cookie_pairs(scope) if key and key != ours]
    host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), "")
    secure = scope.get("scheme") in ("https", "wss")
    return [
        *([("cookie", "; ".join(kept))] if kept else []),
        ("x-forwarded-host", host),
        ("x-forwarded-proto", "https" if secure else "http"),
    ]


def safe_next(path: str) -> str:
    """Where the port origin sends a browser after a grant: a path on that origin only."""
    if not path.startswith("/") or path.startswith(("//", "/\\")) or "\\" in path:
        return "/"
    return path


# What a browser is told, by code (console.instances.access.ConnectRefused and the port
# origin's own).
TITLES = {
    ErrorCode.NOT_FOUND: "No such port",
    ErrorCode.PERMISSION_DENIED: "Not allowed",
    ErrorCode.NOT_RUNNING: "The instance is not running",
    ErrorCode.AGENT_UNAVAILABLE: "Its host is not answering",
    ErrorCode.PORT_UNREACHABLE: "Nothing is listening on this port",
    ErrorCode.INVALID_PATH: "Not a path this port serves",
    ErrorCode.INVALID_GRANT: "This link has expired",
    ErrorCode.NOT_AUTHENTICATED: "Sign in first",
    ErrorCode.CROSS_ORIGIN: "Refused from another site",
}


def error_context(code: ErrorCode, detail: str, back: str) -> dict:
    """What templates/ports/error.html shows: what happened, and a link back to `back`."""
    return {"title": TITLES.get(code, "Refused"), "detail": detail, "back": back}


# --- the console's side -------------------------------------------------------------------


@tenant_view(READ)
def open_port(request, pk: str, port: str):
    """/instances/{id}/ports/{port}/{path}: a grant for the instance's port, handed over by
    redirecting to its origin (then to `path` there); a page saying why not otherwise."""
    pk, port = int(pk), int(port)
    try:
        access.target(request.membership, pk, port)
    except access.ConnectRefused as refused:
        context = error_context(refused.code, refused.detail, f"/instances/{pk}/")
        return render(request, "ports/error.html", context, status=refused.status)
    prefix = f"/instances/{pk}/ports/{port}"
    console = request.build_absolute_uri("/")[:-1]
    grant = mint_grant(pk, port, request.membership.pk, console)
    rest = request.get_full_path()[len(prefix) :]
    next_path = rest if rest.startswith("/") else f"/{rest}"
    query = urlencode({"g": grant, "next": next_path})
    answer = HttpResponseRedirect(f"{origin_url(pk, port, console)}{GRANT_PATH[1:]}?{query}")
    answer["Cache-Control"] = "no-store"
    answer["Referrer-Policy"] = "no-referrer"
    return answer
