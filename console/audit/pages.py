"""Refusals of the console's pages on record, as the API's are (console.audit.refusals): a
person's POST refused for their role (accounts.guards.tenant_view), for an object not theirs or
not there (a 404), or for its state, a quota or a budget (a DomainError the view shows as a
message) is one entry with the error code and the form's fields, their secrets masked.

Not recorded: reads (GET), a form's own validation errors, a request nobody is signed in for
(recorder.record_refusal records a person's only)."""

from console import secret_env
from console.audit import recorder, refusals

NOT_KEPT = frozenset({"csrfmiddlewaretoken"})


def _named(request) -> tuple[str, str]:
    """(object type, action) of the refused page: its URL's namespace made singular and its
    `action` argument or name (`instances:act` stopping: `instance.stop`; `instances:launch`:
    `instance.launch`), else as the API names a route (`member-role`: `member.role`)."""
    match = request.resolver_match
    name = match.url_name or ""
    if match.namespace:
        kind = match.namespace.split(":")[-1].removesuffix("s").replace("_", "")
        verb = match.kwargs.get("action") or name
    else:
        kind, _, verb = name.partition("-")
        verb = verb or refusals.METHOD_VERBS["POST"]
    return kind, f"{kind}.{verb.replace('-', '_')}"


def _lines(value: str) -> str:
    """A field of `NAME=value` lines (the launch form's environment) with the value of each
    name that says it holds a credential masked."""
    kept = []
    for line in value.splitlines():
        name, equals, _ = line.partition("=")
        secret = equals and refusals.secret_name(name.strip())
        kept.append(f"{name}={secret_env.MASK}" if secret else line)
    return "\n".join(kept)


def _fields(request) -> dict:
    """The POSTed form as the log keeps it: no CSRF token, a secret field masked, and each
    credential in `NAME=value` lines."""
    fields = {}
    for name, values in request.POST.lists():
        if name not in NOT_KEPT:
            values = [_lines(value) for value in values]
            fields[name] = values[0] if len(values) == 1 else values
    return refusals.asked(fields)


def refused(request, code: str, message: str) -> None:
    """Record that a page refused the person's POST `request` with `code` (an ErrorCode, as
    the API would answer) and `message` (what the page told them)."""
    if request.method != "POST":
        return
    membership = getattr(request, "membership", None)
    kind, action = _named(request)
    recorder.record_refusal(
        action,
        tenant_id=membership.tenant_id if membership else None,
        object_type=kind,
        object_id=str(request.resolver_match.kwargs.get("pk", "")),
        asked=_fields(request),
        code=code,
        message=message,
    )
