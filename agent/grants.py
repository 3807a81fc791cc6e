"""Data-plane grants: the credential a tenant's request carries through the agent (a web port,
the terminal) instead of the host secret, which opens only the control routes.

A grant is `<expires>.<hex HMAC-SHA256>`, keyed by a key derived from the host secret, over the
exact scope it opens and its expiry (unix seconds) as a JSON list, so that no field can run
into the next: `["port", instance, port, expires]` or `["terminal", instance, expires]`. The
console mints one per request (console/fleet/agent_client.py); the agent recomputes it from the
parameters of the route it matched, so a grant opens that instance's port (or terminal) and
nothing else, until it expires."""

import hashlib
import hmac
import json
import re
import time

CONTEXT = b"gpucloud data plane"
TOKEN = re.compile(r"([0-9]{1,12})\.([0-9a-f]{64})")


def data_key(secret: str) -> bytes:
    """The key grants are signed with: not the host secret itself, which a grant never shows."""
    return hmac.new(secret.encode(), CONTEXT, hashlib.sha256).digest()


def signature(key: bytes, scope: tuple, expires: int) -> str:
    message = json.dumps([*scope, expires], separators=(",", ":")).encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def valid(key: bytes, scope: tuple, token: str) -> bool:
    """Whether `token` is an unexpired grant of exactly `scope` (constant-time compare)."""
    match = TOKEN.fullmatch(token)
    if match is None or int(match[1]) < time.time():
        return False
    return hmac.compare_digest(signature(key, scope, int(match[1])), match[2])
