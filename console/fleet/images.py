"""The images hosts hold and those the catalog wants ready on them (the agent's side is
agent/image_store.py).

- Each `oci` agent's inventory lists the images its engine holds; `sync` keeps them as
  HostImage rows (by reference) and the agent's image settings and pre-pull states on its
  Host. Placement prefers a host that holds a launch's image (`holders`).
- The settings an agent should apply are the catalog's pre-pull images, its region's
  registry mirror and the registries of the catalog's images, which it checks for
  reachability (`wanted_settings`; its answers are the host's `registry_checks`, which
  console/fleet/image_availability.py reads). They are pushed (PUT /v1/images/settings) when a host
  joins, when the catalog's pre-pull set or a region's mirror changes, and by the beat to any
  host whose reported settings drifted from them (an agent that lost its state).
- An operator's clean-up asks the agent to remove what it pulled that nothing uses and no
  pre-pull wants; the outcome is a host event. An agent also cleans up by itself when the
  engine's disk is short (its inventory's `image_disk`): that is a host event too, once.
"""

import hashlib
import json
import logging
from datetime import UTC, datetime

from django.core.cache import cache
from django.db import transaction
from django.db.models.signals import post_delete, post_save

from console.catalog.models import Image, Region
from console.celery import enqueue_on_commit
from console.fleet import agent_client
from console.fleet.models import Host, HostEvent, HostImage

log = logging.getLogger(__name__)

PUSH_THROTTLE_SECONDS = 30  # one push of the same settings to a host per this long
# pre-pull states as the agent reports them
PRE_PULL_STATES = ("waiting", "pulling", "pulled", "failed")
QUIET = (Host.Status.UNREACHABLE, Host.Status.RETIRED)  # hosts nothing is pushed to
UNITS = ("B", "kB", "MB", "GB", "TB")


def normalize(reference: str) -> str:
    """A reference as engines store it, as agent/image_store.py normalizes the agents' (the
    console does not import the agent): `ubuntu` → `docker.io/library/ubuntu:latest`."""
    name, at, digest = reference.partition("@")
    first, slash, rest = name.partition("/")
    if not slash or ("." not in first and ":" not in first and first != "localhost"):
        first, rest = "docker.io", name
    if first == "docker.io" and "/" not in rest:
        rest = f"library/{rest}"
    if not at and ":" not in rest.rsplit("/", 1)[-1]:
        rest += ":latest"
    return f"{first}/{rest}{at}{digest}"


def human_size(size: float) -> str:
    """Bytes in decimal units, as agent/pulls.py words an image's (the console does not import
    the agent): `3.4 GB`."""
    for unit in UNITS[:-1]:
        if abs(size) < 1000:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} {UNITS[-1]}"


def registry_of(reference: str) -> str:
    """The registry a reference is pulled from: `ubuntu` → `docker.io`."""
    return normalize(reference).partition("/")[0]


def holders(region_id: int, reference: str) -> frozenset[int]:
    """The hosts of the region that hold the image `reference`."""
    return frozenset(
        HostImage.objects.filter(
            host__region_id=region_id, reference=normalize(reference)
        ).values_list("host_id", flat=True)
    )


# --- the agents' reports -----------------------------------------------------------------


def _entries(inventory: dict) -> dict[str, dict]:
    """reference → its image, from the inventory's `images` (malformed entries left out)."""
    found: dict[str, dict] = {}
    for image in inventory.get("images") or []:
        if not isinstance(image, dict) or not isinstance(image.get("id"), str):
            continue
        size = image.get("size")
        layers = [layer for layer in image.get("layers") or [] if isinstance(layer, str)]
        for reference in image.get("references") or []:
            if isinstance(reference, str) and 0 < len(reference) <= 255:
                found[normalize(reference)] = {
                    "image_id": image["id"][:80],
                    "size_bytes": size if isinstance(size, int) and size >= 0 else 0,
                    "layers": layers,
                }
    return found


def _pre_pulls(inventory: dict) -> list[dict]:
    states = []
    for item in inventory.get("pre_pulls") or []:
        if isinstance(item, dict) and isinstance(item.get("reference"), str):
            state = item.get("state") if item.get("state") in PRE_PULL_STATES else "waiting"
            detail = item.get("detail") if isinstance(item.get("detail"), str) else ""
            states.append({"reference": item["reference"][:255], "state": state, "detail": detail})
    return states


def sync(host: Host, inventory: dict) -> dict:
    """Make the host's HostImage rows what its inventory lists (inside the caller's
    transaction, which holds the host's lock); answer the Host fields it reports."""
    reported = _entries(inventory)
    held = {row.reference: row for row in HostImage.objects.filter(host=host)}
    gone = [row.pk for reference, row in held.items() if reference not in reported]
    if gone:
        HostImage.objects.filter(pk__in=gone).delete()
    for reference, fields in reported.items():
        row = held.get(reference)
        if row is None:  # unless a launch noted it meanwhile (note_held)
            HostImage.objects.update_or_create(host=host, reference=reference, defaults=fields)
        elif any(getattr(row, name) != value for name, value in fields.items()):
            HostImage.objects.filter(pk=row.pk).update(**fields)
    _note_room_made(host, inventory.get("image_disk"))
    settings = inventory.get("image_settings")
    return {
        "image_settings": settings if isinstance(settings, dict) else {},
        "pre_pulls": _pre_pulls(inventory),
        "registry_checks": _registry_checks(inventory),
    }


def _registry_checks(inventory: dict) -> list[dict]:
    """The inventory's `registries`, as the serializer checked them."""
    return [
        {
            "registry": check["registry"],
            "reachable": check["reachable"],
            "error": check.get("error", ""),
            "checked_at": check["checked_at"],
        }
        for check in inventory.get("registries") or []
    ]


def _note_room_made(host: Host, disk: dict | None) -> None:
    """The agent's last clean-up for room on its disk (agent/image_store.py), as a host event
    the first time the inventory reports it."""
    made = (disk or {}).get("last_clean_up")
    if not made:
        return
    at = datetime.fromtimestamp(made["at"], UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    removed = made["removed"]
    text = (
        f"image clean-up by the agent at {at}: its disk was {made['percent_before']:.0f}% full "
        f"(at most {disk['high_percent']}%); removed "
        + (f"{len(removed)} ({made['freed_bytes'] / 1e9:.1f} GB)" if removed else "none")
    )
    if made.get("percent_after") is not None:
        text += f"; {made['percent_after']:.0f}% full now"
    if removed:
        text += ": " + ", ".join(removed)
    text = text[:300]
    if not HostEvent.objects.filter(host=host, message=text).exists():
        HostEvent.objects.create(
            host=host, actor_label="agent", from_status=host.status, to_status=host.status,
            message=text,
        )  # fmt: skip


def note_held(host_pk: int, reference: str) -> None:
    """A workload of `reference` runs on the host, so the host holds it now: placement prefers
    it for the next launch at once, not from its next heartbeat (which fills in the image's id,
    size and layers)."""
    HostImage.objects.get_or_create(
        host_id=host_pk, reference=normalize(reference), defaults={"image_id": ""}
    )


# --- what the agents should apply ----------------------------------------------------------


def wanted_settings(region: Region) -> dict:
    """The body of PUT /v1/images/settings for the region's hosts."""
    catalog = Image.objects.filter(active=True).values_list("reference", "pre_pull")
    registries = {registry_of(reference) for reference, _ in catalog} - {"localhost"}
    return {
        "pre_pull": sorted({normalize(reference) for reference, pre_pull in catalog if pre_pull}),
        "mirror": region.registry_mirror,
        "registries": sorted(registries),
    }


def for_agent(host: Host, wanted: dict) -> dict:
    """The settings as the host's agent takes them: an agent one version behind checks no
    registries (its settings have no `registries`) and refuses a body that names them."""
    if "registries" in host.image_settings:
        return wanted
    return {name: value for name, value in wanted.items() if name != "registries"}


def push_when_due(host: Host, wanted: dict | None = None) -> bool:
    """Once committed, push the settings to the host when its agent applies others (and
    holds images at all); the same push is not queued twice within PUSH_THROTTLE_SECONDS.
    Answers whether one was queued."""
    if not host.image_settings or host.status in QUIET:
        return False
    wanted = for_agent(host, wanted or wanted_settings(host.region))
    if host.image_settings == wanted:
        return False
    digest = hashlib.sha256(json.dumps(wanted, sort_keys=True).encode()).hexdigest()[:16]
    key = f"fleet:image-settings:{host.pk}:{digest}"
    if not cache.add(key, True, PUSH_THROTTLE_SECONDS):
        return False
    enqueue_on_commit("console.fleet.tasks.push_image_settings", host.pk)
    return True


def push_due() -> list[int]:
    """Queue a push to every host whose agent applies other settings than it should (the
    beat's, and after a change of the catalog or of a region)."""
    pushed = []
    by_region: dict[int, dict] = {}
    for host in (
        Host.objects.exclude(image_settings={}).exclude(status__in=QUIET).select_related("region")
    ):
        wanted = by_region.setdefault(host.region_id, wanted_settings(host.region))
        if push_when_due(host, wanted):
            pushed.append(host.pk)
    return pushed


def push_settings(host_pk: int) -> bool:
    """Hand the host's agent its settings (idempotent) and note what it now applies. False
    when there was nothing to do."""
    host = Host.objects.select_related("region").filter(pk=host_pk).first()
    if host is None or host.status in QUIET or not host.image_settings:
        return False
    wanted = for_agent(host, wanted_settings(host.region))
    applied = agent_client.put_image_settings(host, wanted)
    Host.objects.filter(pk=host.pk).update(image_settings=applied)
    log.info("host %s: pre-pull %s, mirror %s", host.name, wanted["pre_pull"], wanted["mirror"])
    return True


def _catalog_changed(sender, instance, **kwargs) -> None:
    """A catalog image or a region changed: the hosts it concerns get their new settings."""
    if kwargs.get("raw"):
        return
    transaction.on_commit(push_due)


post_save.connect(_catalog_changed, sender=Image, dispatch_uid="fleet-images-image-saved")
post_delete.connect(_catalog_changed, sender=Image, dispatch_uid="fleet-images-image-deleted")
post_save.connect(_catalog_changed, sender=Region, dispatch_uid="fleet-images-region-saved")


# --- the fleet page ----------------------------------------------------------------------

BADGES = {"pulled": "ok", "pulling": "provisioning", "waiting": "pending", "failed": "failed"}


def describe(host: Host) -> None:
    """What the fleet page shows of a host's images (its `images` prefetched): how many it
    holds and their bytes (an image under several references counted once), and a badge for
    each pre-pull's state."""
    held = {image.image_id: image.size_bytes for image in host.images.all()}
    host.image_count, host.image_bytes = len(held), sum(held.values())
    for pull in host.pre_pulls:
        pull["badge"] = BADGES.get(pull.get("state"), "pending")


# --- clean-up ------------------------------------------------------------------------------


def queue_clean_up(host: Host, actor) -> None:
    """An operator asks for the host's image clean-up: queued; its outcome is a host event."""
    if not host.image_settings:
        raise ValueError(f"{host.name} runs workloads as {host.runtime or '?'}: it holds no images")
    enqueue_on_commit("console.fleet.tasks.clean_up_images", host.pk, actor.get_username())


def clean_up(host_pk: int, actor_label: str) -> dict | None:
    """Ask the agent to remove the images it pulled that no allocation there uses and no
    pre-pull wants; the outcome is a host event. None: the host is gone or retired."""
    host = Host.objects.filter(pk=host_pk).first()
    if host is None or host.status == Host.Status.RETIRED:
        return None
    outcome = agent_client.clean_up_images(host)
    removed = outcome.get("removed") or []
    freed = outcome.get("freed_bytes") or 0
    text = f"image clean-up by {actor_label}: "
    text += f"removed {', '.join(removed)} ({freed / 1e9:.1f} GB)" if removed else "removed none"
    if outcome.get("kept"):
        text += f"; kept {len(outcome['kept'])} in use"
    HostEvent.objects.create(
        host=host,
        actor_label=actor_label[:80],
        from_status=host.status,
        to_status=host.status,
        message=text[:300],
    )
    return outcome
