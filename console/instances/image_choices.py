"""The launch form's catalog images: what each is (its description, size, the ports it serves),
whether each region can obtain it (console/fleet/image_availability.py), and, where the
scheduler would place a spec on a host that already holds it, which host ("on host-b:
cached": it starts without a pull)."""

from console.catalog.models import Image, Spec
from console.fleet.image_availability import Fleet
from console.instances import availability, placement

APP_NAMES = {"jupyter": "JupyterLab"}


def serves(image: Image) -> str:
    """What it serves, in words: `JupyterLab (8888) · metrics (9100)`; "" for none."""
    return " · ".join(
        f"{APP_NAMES.get(entry.get('app'), entry['name'])} ({entry['port']})"
        for entry in image.ports
    )


def cached_on(spec: Spec, checker: availability.Checker, held: dict[int, int]) -> str:
    """The host that already holds the image where the scheduler would place `spec` now
    (preferring holders as a launch does: console/scheduler/locality.py); "" when it would
    go elsewhere, or fits nowhere now."""
    if not held:
        return ""
    choice = placement.choose(spec, checker.now, holders=frozenset(held))
    if choice is None or choice.host_pk not in held:
        return ""
    return checker.now.names[choice.host_pk]


def _cached(specs: list[Spec], checker: availability.Checker, held: dict[int, int]) -> dict:
    """spec code → the host that holds the image where that spec would go, for the specs
    that fit now."""
    fitting = [spec for spec in specs if checker.of(spec).status == availability.FITS_NOW]
    hosts = {spec.code: cached_on(spec, checker, held) for spec in fitting}
    return {code: host for code, host in hosts.items() if host}


def options(images: list[Image], checkers: list[availability.Checker], specs: list[Spec]):
    """Each image with what the form shows of it, and `by_region`: region code → {status,
    label, detail, size, launchable, cached: {spec code: host}} (cached only for the specs
    that fit there now)."""
    fleets = [(checker, Fleet(checker.region)) for checker in checkers]
    found = []
    for image in images:
        by_region = {}
        for checker, fleet in fleets:
            where = fleet.of(image.reference)
            held = fleet.held(image.reference)
            cached = _cached(specs, checker, held) if held else {}
            by_region[checker.region.code] = {
                "status": where.status,
                "label": where.label,
                "detail": where.detail,
                "size": where.size,
                "launchable": where.launchable,
                "cached": cached,
            }
        found.append({"image": image, "serves": serves(image), "by_region": by_region})
    return found
