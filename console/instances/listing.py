"""Instances as the API shows them (the `Instance` schema of serializers.py), built from plain
rows: a page of 50 costs a handful of queries and builds no model instance per row. Model
instances and their prefetches (a related manager and a queryset per row and relation) cost
three quarters of a list request's CPU (bench/api.py); lists, details and the answers to
actions all come from here, so the three cannot disagree."""

from collections import defaultdict
from datetime import UTC, datetime
from decimal import Decimal

from django.db.models import QuerySet
from django.utils import timezone

from console import secret_env
from console.catalog.models import SpecPrice, gpu_equivalents, price_in_force
from console.instances import (
    access,
    lifecycle,
    placement,
    port_origin,
    reasons,
    restarts,
    sign_in,
)
from console.instances.models import Allocation, Instance, State
from console.speedups.prepared import Prepared, PreparedRows

COLUMNS = (
    "id", "name", "state", "state_reason_code", "state_reason_detail", "command", "env",
    "secret_env", "exit_code", "ports", "disk_gib", "created_by_id", "created_at", "updated_at",
    "terminated_at", "spec_id",
    "spec__code", "image__name", "image__reference", "image__ports", "image_reference",
    "image_digest", "region__code",
    "disk_host__name", "app_token", "restart_policy", "on_host_loss", "restart_count",
    "restart_at", "spec__ram_mib", "spec__gpu_memory_mib", "pull_progress",
)  # fmt: skip
SPEC_FIGURES = ("spec__mode", "spec__gpu_count", "spec__mig_profile__size", "spec__milli")
HOST_COLUMNS = ("instance_id", "host__address", "host__name", "host__ssh_port",
                "host__ssh_host_key_fingerprint", "host__ssh_host_key")  # fmt: skip


# The queries of a list, compiled once (console/speedups/prepared.py): building their SQL costs
# more than running it, ~2 ms of a list request (bench/api.py).
_ROWS = Prepared(Instance.objects.values(*COLUMNS))
_CURRENT_HOSTS = Prepared(
    Allocation.objects.filter(released_at__isnull=True).order_by().values_list(*HOST_COLUMNS)
)
_GRANTED_KEYS = Prepared(
    Instance.ssh_keys.through.objects.order_by("sshkey__name", "sshkey_id").values_list(
        "instance_id", "sshkey__name", "sshkey__membership__user_id",
        "sshkey__membership__user__username",
    )
)  # fmt: skip
_PRICE_POINTS = Prepared(
    SpecPrice.objects.order_by("effective_from").values_list(
        "spec_id", "effective_from", "price_per_hour", *SPEC_FIGURES
    )
)


def rows(tenant, name_prefix: str = "", **filters) -> PreparedRows | QuerySet:
    """The columns `represent` needs, of the tenant's instances that match `filters` (values
    as the database holds them: `pk=` an int, `state__in=` a list; still lazy: paginate it).
    A `name_prefix` (a scoped API token's) keeps those whose name starts with it, through the
    ORM: a prepared query compares for equality only."""
    if name_prefix:
        found = Instance.objects.filter(tenant_id=tenant.pk, name__startswith=name_prefix)
        return found.filter(**filters).values(*COLUMNS)
    return _ROWS.filter(tenant_id=tenant.pk, **filters)


def represent(rows: list[dict], *, shell: bool, staff: bool, base_url: str) -> list[dict]:
    """The API's view of each row: `shell` (the caller may open shells) adds the ssh command
    of running instances and the sign-in query of its ports' apps, `staff` the placement; port
    URLs start with `base_url` (the console's origin as the client reached it), their own
    origins take its scheme and port."""
    if not rows:
        return []
    ids = [row["id"] for row in rows]
    running = [row["id"] for row in rows if row["state"] == State.RUNNING]
    hosts = {}
    if shell and running:
        current = _CURRENT_HOSTS.filter(instance_id__in=running)
        hosts = {values[0]: values[1:] for values in current}
    placements = {}
    if staff:
        current = Allocation.objects.filter(instance_id__in=ids, released_at__isnull=True)
        placements = {a.instance_id: placement.describe(a) for a in current.select_related("host")}
    keys = _key_names(ids)
    figures = _spec_figures({row["spec_id"] for row in rows})
    now = timezone.now()
    return [
        _one(row, hosts.get(row["id"]), keys[row["id"]], figures[row["spec_id"]],
             placements.get(row["id"]), base_url, shell, now)
        for row in rows
    ]  # fmt: skip


def _one(row, host, keys, figures, placed, base_url, shell, now) -> dict:
    instance_id, state, restart_at = row["id"], row["state"], row["restart_at"]
    reason = reasons.Reason(row["state_reason_code"], row["state_reason_detail"])
    ports = access.declared_ports(row["image__ports"] or [], row["ports"])
    queries = [_query(entry, row["app_token"], shell) for entry in ports]
    return {
        "id": instance_id,
        "name": row["name"],
        "state": row["state"],
        "state_reason": reason.text,
        "reason_text": reasons.explain(
            reason,
            ram_mib=row["spec__ram_mib"],
            gpu_memory_mib=row["spec__gpu_memory_mib"],
            exit_code=row["exit_code"],
        ),
        "pull_progress": row["pull_progress"] or None,
        "spec": row["spec__code"],
        "image": row["image__name"] or row["image_reference"],
        "image_reference": row["image__reference"] or row["image_reference"],
        "image_digest": row["image_digest"],
        "command": row["command"],
        "env": row["env"],
        "secret_env": secret_env.masked(row["secret_env"]),
        "exit_code": row["exit_code"],
        "restart_policy": row["restart_policy"],
        "on_host_loss": row["on_host_loss"],
        "restart_count": row["restart_count"],
        "restart_at": timestamp(restart_at),
        "restarting": restarts.describe(state, row["restart_count"], restart_at, now) or None,
        "disk": {"size_gib": row["disk_gib"], "host": row["disk_host__name"]},
        "ssh": access.ssh_endpoint(instance_id, *host) if host else None,
        "ssh_keys": [
            name if user_id == row["created_by_id"] else f"{username}/{name}"
            for name, user_id, username in keys
        ],
        "ports": [
            {
                "port": entry["port"],
                "name": entry["name"],
                "url": base_url + access.port_path(instance_id, entry["port"]) + query,
                "origin_url": port_origin.origin_url(instance_id, entry["port"], base_url) + query,
            }
            for entry, query in zip(ports, queries, strict=True)
        ],
        "region": row["region__code"],
        "gpu_equivalents": figures[0],
        "price_per_hour": figures[1],
        "actions": lifecycle.allowed_actions(state, restart_at),
        "created_at": timestamp(row["created_at"]),
        "updated_at": timestamp(row["updated_at"]),
        "terminated_at": timestamp(row["terminated_at"]),
        "placement": placed,
    }


def _query(entry: dict, token: str, shell: bool) -> str:
    """What a port's links end with: its app's sign-in query, for members who open ports."""
    query = sign_in.app_query(entry, token) if shell else ""
    return f"?{query}" if query else ""


def _key_names(ids: list[int]) -> dict[int, list[tuple]]:
    """Per instance, the keys it grants: (name, owner's user id, owner's username), by name."""
    keys = defaultdict(list)
    for instance_id, *key in _GRANTED_KEYS.filter(instance_id__in=ids):
        keys[instance_id].append(key)
    return keys


def _spec_figures(spec_ids: set[int]) -> dict[int, tuple[str, str]]:
    """Per spec: its GPU equivalents and its price per hour now, as the API writes them, from
    one query of its price points (a saved spec has at least one) and the fields they need."""
    specs: dict[int, tuple[list, list]] = {}
    points = _PRICE_POINTS.filter(spec_id__in=sorted(spec_ids))
    for spec_id, effective_from, price, *figures in points:
        specs.setdefault(spec_id, (figures, []))[1].append((effective_from, price))
    return {
        spec_id: (
            decimal_text(gpu_equivalents(*figures), 3),
            decimal_text(price_in_force(prices), 4),
        )
        for spec_id, (figures, prices) in specs.items()
    }


def decimal_text(value: Decimal, places: int) -> str:
    """As DRF writes a DecimalField with `decimal_places` and normalize_output: "0.25", "2"."""
    return f"{value.quantize(Decimal(1).scaleb(-places)).normalize():f}"


def timestamp(value: datetime | None) -> str | None:
    """As DRF writes a DateTimeField (TIME_ZONE is UTC): ISO 8601, "Z" for UTC."""
    if value is None:
        return None
    text = value.astimezone(UTC).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text
