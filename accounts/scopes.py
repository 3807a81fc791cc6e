"""What an API token may do: the fixed vocabulary of scopes, the endpoint each one opens,
and the checks the API, the websockets and the port proxy make with them.

A token with no scopes (`ApiToken.scopes` null) may do whatever its user's role allows, as
tokens always could. A scoped token may do only what its scopes name (`instances:*` names
every scope of `instances`), and never more than its user's role allows at the time of the
request. A token confined to a name prefix sees and acts on only the instances whose name
starts with it; the others are not found.

Every view of the REST API names the scope each of its actions needs in `api_scopes`: one
scope for the whole view, or a dict from action (a viewset's `list`, `create`, `stop` …) or
HTTP method (an APIView's `get`, `post` …) to scope. A scoped token is refused wherever a view
names none; tests/api/test_token_scope_map.py fails for any endpoint of the schema without one.
"""

from dataclasses import dataclass

from django.core.exceptions import ValidationError

from accounts.roles import MANAGE, OPERATE, READ, at_least


@dataclass(frozen=True)
class Scope:
    name: str
    label: str
    role: str  # the least role that can use it
    whole_tenant: bool = False  # it shows every instance: never for a prefix-confined token

    @property
    def group(self) -> str:
        return self.name.partition(":")[0]


SCOPES = (
    Scope("instances:read", "list and show instances, their events and logs", READ),
    Scope("instances:launch", "launch instances", OPERATE),
    Scope("instances:start", "start stopped instances", OPERATE),
    Scope("instances:stop", "stop instances", OPERATE),
    Scope("instances:reboot", "reboot instances", OPERATE),
    Scope("instances:resize", "resize instances", OPERATE),
    Scope("instances:terminate", "terminate instances", OPERATE),
    Scope("instances:shelve", "shelve stopped instances (their disk kept as a snapshot)", OPERATE),
    Scope("instances:connect", "open terminals and web ports of instances", OPERATE),
    Scope("templates:read", "list launch templates", READ),
    Scope("templates:write", "create, change and delete launch templates", OPERATE),
    # volumes name (and attach to) any instance of the tenant: never for a prefix-confined token
    Scope("volumes:read", "list volumes and their prices", READ, whole_tenant=True),
    Scope(
        "volumes:write",
        "create, attach, detach and delete volumes",
        OPERATE,
        whole_tenant=True,
    ),
    Scope("snapshots:read", "list snapshots and snapshot schedules", READ),
    Scope("snapshots:write", "take and delete snapshots, set snapshot schedules", OPERATE),
    Scope("idle:read", "read idle policies and when they act", READ),
    Scope("idle:write", "set instances' idle policies, keep a warned instance running", OPERATE),
    Scope("idle:tenant", "set the tenant's default idle policy", MANAGE, whole_tenant=True),
    Scope("metrics:read", "read instances' metrics (history and live)", READ),
    Scope("catalog:read", "read specs, images and regions", READ),
    Scope("quota:read", "read the tenant's quota and what it uses", READ),
    Scope("billing:read", "read usage, costs and invoices", READ, whole_tenant=True),
    Scope("keys:read", "list your SSH keys", READ),
    Scope("keys:write", "add and delete your SSH keys", OPERATE),
    Scope("tokens:read", "list API tokens", READ),
    Scope("tokens:write", "create and revoke API tokens (never beyond this token's own)", READ),
    Scope(
        "notifications:read",
        "list notification endpoints and their deliveries",
        MANAGE,
        whole_tenant=True,
    ),
    Scope(
        "notifications:write",
        "add, change, test and delete notification endpoints",
        MANAGE,
        whole_tenant=True,
    ),
    Scope("audit:read", "read the tenant's audit log", MANAGE, whole_tenant=True),
    Scope(
        "registries:read",
        "list the tenant's registry credentials (never their tokens)",
        MANAGE,
        whole_tenant=True,
    ),
    Scope(
        "registries:write",
        "add, replace and remove the tenant's registry credentials",
        MANAGE,
        whole_tenant=True,
    ),
)
BY_NAME = {scope.name: scope for scope in SCOPES}
GROUPS = tuple(dict.fromkeys(scope.group for scope in SCOPES))
CHOICES = (*BY_NAME, *(f"{group}:*" for group in GROUPS))
READ_ONLY = tuple(scope.name for scope in SCOPES if scope.role == READ)
MAX_PREFIX = 40


def covered(granted: str) -> list[Scope]:
    """The scopes a granted name stands for: itself, or its group's for `group:*`."""
    group, _, action = granted.partition(":")
    if action == "*":
        return [scope for scope in SCOPES if scope.group == group]
    return [BY_NAME[granted]] if granted in BY_NAME else []


def grants(scopes: list[str] | None, needed: str) -> bool:
    """Whether a token's scopes (None: unscoped) hold `needed`."""
    if scopes is None:
        return True
    return needed in scopes or f"{needed.partition(':')[0]}:*" in scopes


def clean_scopes(names, role: str, *, read_only: bool, instance_prefix: str) -> list[str]:
    """The scopes a token asks for, checked against the vocabulary, what its user's role
    (a viewer's, for a read-only token) can use and its prefix; ValidationError on `scopes`
    otherwise."""
    if not isinstance(names, list | tuple) or not names:
        raise ValidationError({"scopes": "Name at least one scope."})
    problems, cleaned = [], []
    for name in dict.fromkeys(names):
        found = covered(name) if isinstance(name, str) else []
        if not found:
            problems.append(f"Unknown scope {name!r}; see the list of scopes.")
            continue
        beyond = [scope.name for scope in found if not at_least(role, scope.role)]
        if beyond and read_only:
            problems.append(f"A read-only token cannot hold {', '.join(beyond)}.")
        elif beyond:
            problems.append(f"Your role ({role}) cannot grant {', '.join(beyond)}.")
        wide = [scope.name for scope in found if scope.whole_tenant]
        if wide and instance_prefix:
            problems.append(
                f"{', '.join(wide)} shows every instance: a token confined to instances "
                f'named "{instance_prefix}…" cannot hold it.'
            )
        cleaned.append(name)
    if problems:
        raise ValidationError({"scopes": problems})
    return cleaned


def clean_prefix(prefix: str) -> str:
    prefix = (prefix or "").strip()
    if len(prefix) > MAX_PREFIX or any(char.isspace() for char in prefix):
        raise ValidationError(
            {"instance_prefix": f"At most {MAX_PREFIX} characters, without spaces."}
        )
    return prefix


def required(view, method: str) -> str | None:
    """The scope a request to `view` with `method` needs, as the view names it; None when
    it names none."""
    declared = getattr(view, "api_scopes", None)
    if isinstance(declared, str) or declared is None:
        return declared
    key = getattr(view, "action", None) or method.lower()
    return declared.get(key)


# --- what a request's membership (and the token it came with, if any) may do ---------------


def token_of(membership):
    """The API token a membership acts through (authenticate_token sets it), or None."""
    return getattr(membership, "api_token", None)


def allows(membership, needed: str) -> bool:
    token = token_of(membership)
    return token is None or grants(token.scopes, needed)


def instance_prefix(membership) -> str:
    """The name prefix the request is confined to ("" for none)."""
    token = token_of(membership)
    return token.instance_prefix if token is not None else ""


def covers_instance(membership, name: str) -> bool:
    return name.startswith(instance_prefix(membership))


def sees_whole_tenant(membership) -> bool:
    """Whether the request may see every instance of its tenant (no prefix confines it)."""
    return not instance_prefix(membership)


def confined_detail(prefix: str) -> str:
    return (
        f'This API token is confined to instances named "{prefix}…"; this shows every '
        "instance of the tenant."
    )


def prefix_refusal(prefix: str) -> str:
    return (
        f'This API token launches only instances whose name starts with "{prefix}": '
        "name the instance so."
    )


def volumes_refusal(prefix: str) -> str:
    return (
        f'This API token is confined to instances named "{prefix}…" and cannot attach '
        "volumes (they are the whole tenant's): launch without them."
    )


def missing_detail(needed: str) -> str:
    return f"This token lacks the scope {needed}."
