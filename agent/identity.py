"""The secret this agent shares with the console, and its rotation.

The console hands a new secret over the control plane (`PUT /v1/identity/secret`, with the
current one), at the address the host joined with: the agent keeps it in identity.json (its
state directory, 0600, written atomically), signs its heartbeats, samples and events with it
from then on, and takes the console's calls (and grants, agent/grants.py) with it and, for
`grace_seconds` more, with the one before (the console's calls in flight). A revoke gives no
grace: the old secret opens nothing here any more either."""

import hmac
import re
import time

from agent import grants
from agent.errors import ApiError, invalid
from agent.state import StateStore

SECRET = re.compile(r"[A-Za-z0-9_-]{32,200}")
MAX_GRACE_SECONDS = 86400.0


class HostSecret:
    def __init__(self, secret: str, store: StateStore | None = None, record: dict | None = None):
        """`store` and `record` (identity.json's content): where a new secret is kept; without
        them (a standalone agent's --secret) it cannot change."""
        self.store = store
        self._record = dict(record or {"secret": secret})
        self._record["secret"] = secret
        self._keys: list[tuple[bytes, bytes, float]] = []
        self._set_keys()

    @classmethod
    def of_identity(cls, store: StateStore, record: dict) -> "HostSecret":
        return cls(record["secret"], store, record)

    def _set_keys(self) -> None:
        """(secret, data key, valid until) of the secret and, while its grace lasts, the one
        before it."""
        current = self._record["secret"]
        self._keys = [(current.encode(), grants.data_key(current), float("inf"))]
        previous = self._record.get("previous_secret")
        until = self._record.get("previous_until") or 0.0
        if previous and until > time.time():
            self._keys.append((previous.encode(), grants.data_key(previous), until))

    @property
    def current(self) -> str:
        return self._record["secret"]

    def _valid(self) -> list[tuple[bytes, bytes, float]]:
        now = time.time()
        return [key for key in self._keys if key[2] > now]

    def accepts(self, token: str) -> bool:
        """Whether `token` is the secret (or the one before it, in its grace): constant time."""
        given = token.encode("latin-1")
        return any([hmac.compare_digest(given, secret) for secret, _, _ in self._valid()])

    def data_keys(self) -> list[bytes]:
        """The keys a grant may be signed with now."""
        return [key for _, key, _ in self._valid()]

    def rotate(self, body) -> dict:
        """Take the console's new secret (`{"secret", "grace_seconds"}`): kept in identity.json
        before anything uses it."""
        if not isinstance(body, dict) or set(body) != {"secret", "grace_seconds"}:
            raise invalid('the body must be {"secret": ..., "grace_seconds": ...}')
        new, grace = body["secret"], body["grace_seconds"]
        if not isinstance(new, str) or not SECRET.fullmatch(new):
            raise invalid("secret must be 32 to 200 URL-safe base64 characters")
        if type(grace) not in (int, float) or not 0 <= grace <= MAX_GRACE_SECONDS:
            raise invalid(f"grace_seconds must be a number from 0 to {MAX_GRACE_SECONDS:.0f}")
        if self.store is None:
            raise ApiError(409, "standalone", "this agent runs with --secret: it keeps that one")
        if new != self.current:
            record = {**self._record, "secret": new}
            record.pop("previous_secret", None)
            record.pop("previous_until", None)
            if grace > 0:
                record.update(previous_secret=self.current, previous_until=time.time() + grace)
            self.store.save_identity(record)
            self._record = record
        elif grace <= 0:  # a revoke of a secret taken already: the one before goes now
            self._record.pop("previous_secret", None)
            self._record.pop("previous_until", None)
            self.store.save_identity(self._record)
        self._set_keys()
        return {"rotated": True}
