"""Refused actions on record, as cloud audit trails keep them (CloudTrail's errorCode): a
person's write through the API refused for permission or scope (403), for an object not theirs
or not there (404), or for its state, a quota or a budget (409) is one entry with the error
code and what the request asked, its secrets masked as the log masks a model's. The console's
pages record theirs the same way (console.audit.pages).

Not recorded: reads (GET, HEAD, OPTIONS), a request nobody is signed in for (401: no actor,
no tenant), a body that is not valid (400: nothing was refused but the form), throttling
(429), a method the endpoint lacks (405) and the console's own failures (5xx)."""

from rest_framework.exceptions import ParseError, UnsupportedMediaType
from rest_framework.permissions import SAFE_METHODS

from accounts.permissions import request_membership
from console import secret_env
from console.audit import capture, context, recorder

REFUSALS = frozenset({403, 404, 409})
VIEWSET_VERBS = {"partial_update": "update", "destroy": "delete"}
METHOD_VERBS = {"POST": "create", "PUT": "update", "PATCH": "update", "DELETE": "delete"}
# how much of a refused request's body is kept
MAX_ITEMS, MAX_DEPTH, MAX_TEXT = 50, 4, 200


def secret_name(name: str) -> bool:
    """A field the log hides from a model's changes, or a name that says it holds a
    credential (`secret_env`, `HF_TOKEN` in `env`, `api_key`)."""
    return capture.is_secret(name) or secret_env.looks_secret(name.upper())


def _text(value, limit: int) -> str:
    """Text as both databases keep it: no NUL (PostgreSQL's jsonb refuses \\u0000), no lone
    surrogate (no UTF-8 has one), each made U+FFFD or '?'."""
    text = str(value)[:limit].replace("\x00", "\ufffd")
    return text.encode("utf-8", "replace").decode("utf-8")


def asked(value, depth: int = 0):
    """`value` (a request's body) as the log keeps it: a secret field's value masked, long
    text, long lists and deep nesting cut, text any database keeps."""
    if depth > MAX_DEPTH:
        return "…"
    if isinstance(value, dict):
        items = list(value.items())[:MAX_ITEMS]
        return {
            _text(k, 64): secret_env.MASK if secret_name(str(k)) else asked(v, depth + 1)
            for k, v in items
        }
    if isinstance(value, list | tuple):
        return [asked(item, depth + 1) for item in value[:MAX_ITEMS]]
    if value is None or isinstance(value, bool | int | float):
        return value
    return _text(value, MAX_TEXT)


def _named(request, view) -> tuple[str, str]:
    """(object type, action) of the refused request: a viewset's route and action
    (`instance.stop`), else its URL's name (`instance-shelve`: `instance.shelve`)."""
    action = getattr(view, "action", None)
    basename = getattr(view, "basename", None)
    if action and basename:
        kind, verb = basename.replace("-", ""), VIEWSET_VERBS.get(action, action)
    else:
        match = request._request.resolver_match
        kind, _, rest = (match.url_name if match and match.url_name else "").partition("-")
        verb = rest.replace("-", "_") or METHOD_VERBS.get(request.method, "")
    verb = getattr(view, "audit_verbs", {}).get(verb, verb)
    return kind, f"{kind}.{verb}"


def _body(request) -> dict:
    try:
        data = request.data
    except (ParseError, UnsupportedMediaType):
        return {}
    return asked(data if isinstance(data, dict) else {"body": data})


def record(request, view, status: int, code: str, message: str) -> None:
    """Record the API's answer `status`/`code` to `request` when it refused a person's write."""
    if request.method in SAFE_METHODS or status not in REFUSALS or view is None:
        return
    if not context.current().is_person:  # an agent's, or nobody's
        return
    membership = request_membership(request)
    kind, action = _named(request, view)
    recorder.record_refusal(
        action,
        tenant_id=membership.tenant_id if membership else None,
        object_type=kind,
        object_id=str(view.kwargs.get("pk", "")),
        asked=_body(request),
        code=code,
        message=message,
    )
