"""Signed webhooks: each endpoint's secret (sealed at rest with a key derived from
SECRET_KEY) and the ``Gpucloud-Signature`` header, in the style of Stripe's:

    Gpucloud-Signature: t=1767225600,v1=5257a869e7ec…[,v1=…]

``v1`` is the hex HMAC-SHA256, keyed with the endpoint's secret, of ``"{t}."`` followed by
the request's body exactly as sent. While a rotated-out secret is still within its grace
period, a second ``v1`` is made with it: a receiver accepts the request when any ``v1``
matches one of the secrets it knows, and refuses a ``t`` too far from its clock (replay)."""

import base64
import contextlib
import hashlib
import hmac
import secrets
import time

from cryptography.fernet import Fernet, MultiFernet
from django.conf import settings

from console import integers

HEADER = "Gpucloud-Signature"
SECRET_PREFIX = "whsec_"  # noqa: S105 - the prefix of generated secrets, not a secret
# How far from its own clock a receiver should accept a signature's timestamp.
TOLERANCE_SECONDS = 300


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def _fernet() -> MultiFernet:
    """Keys derived from SECRET_KEY (then SECRET_KEY_FALLBACKS, so that a rotated key still
    opens what the old one sealed)."""
    keys = [settings.SECRET_KEY, *settings.SECRET_KEY_FALLBACKS]
    return MultiFernet(
        [
            Fernet(
                base64.urlsafe_b64encode(hashlib.sha256(f"webhook-secret:{key}".encode()).digest())
            )
            for key in keys
        ]
    )


def seal(raw: str) -> str:
    return _fernet().encrypt(raw.encode()).decode()


def unseal(sealed: str) -> str:
    return _fernet().decrypt(sealed.encode()).decode()


def sign(body: bytes, secret: str, timestamp: int) -> str:
    message = f"{timestamp}.".encode() + body
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def header(body: bytes, secrets_: list[str], timestamp: int | None = None) -> str:
    """The signature header for `body`, one ``v1`` per secret (the current one first)."""
    timestamp = int(time.time()) if timestamp is None else timestamp
    return ",".join([f"t={timestamp}", *(f"v1={sign(body, s, timestamp)}" for s in secrets_)])


def verify(
    body: bytes,
    signature_header: str,
    secret: str,
    *,
    now: float | None = None,
    tolerance: int = TOLERANCE_SECONDS,
) -> bool:
    """What a receiver does: the header's timestamp is within `tolerance` of `now`, and one
    of its ``v1`` signatures is the body's under `secret`."""
    timestamp, signatures = None, []
    for part in signature_header.split(","):
        key, _, value = part.strip().partition("=")
        if key == "t":
            with contextlib.suppress(integers.NotAWholeNumber):
                timestamp = integers.parse(value)
        elif key == "v1":
            signatures.append(value)
    now = time.time() if now is None else now
    if timestamp is None or abs(now - timestamp) > tolerance:
        return False
    expected = sign(body, secret, timestamp)
    return any(hmac.compare_digest(expected, candidate) for candidate in signatures)
