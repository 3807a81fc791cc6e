"""Where an agent's metric samples enter the control plane.

The agent API authenticates the host, checks the batch's shape (`check_batch`) and hands it to
`ingest`. For now `ingest` only follows GPU health; the metrics pipeline (live window, history,
websockets, Prometheus) grows here."""

import logging

from django.utils import timezone

from console.fleet.models import Gpu, Host

log = logging.getLogger(__name__)

MAX_SAMPLES = 20000
KINDS = ("gpu", "mig", "allocation")
NUMBER = (int, float)
# field: (accepted types, may be null)
FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "ts": (NUMBER, False),
    "kind": ((str,), False),
    "gpu_index": ((int,), False),
    "gpu_uuid": ((str,), True),
    "mig_uuid": ((str,), True),
    "allocation": ((str,), True),
    "gpu_util": (NUMBER, True),
    "mem_used_mib": (NUMBER, True),
    "mem_total_mib": (NUMBER, True),
    "temperature_c": (NUMBER, True),
    "power_w": (NUMBER, True),
    "sm_clock_mhz": (NUMBER, True),
    "ecc_errors": ((int,), True),
    "healthy": ((bool,), False),
    "processes": ((list,), True),
}
TYPE_NAMES = {
    NUMBER: "a number",
    (int,): "an integer",
    (str,): "a string",
    (bool,): "true or false",
}


def _problem(value, types: tuple[type, ...], nullable: bool) -> str | None:
    if value is None:
        return None if nullable else "may not be null"
    if isinstance(value, bool) and bool not in types:
        return f"must be {TYPE_NAMES.get(types, types[0].__name__)}"
    if not isinstance(value, types):
        return f"must be {TYPE_NAMES.get(types, 'a ' + types[0].__name__)}"
    return None


def check_batch(samples) -> dict[str, str]:
    """Field errors of a batch, keyed like `samples[3].gpu_util`; empty when it is fine."""
    if not isinstance(samples, list):
        return {"samples": "must be a list of samples"}
    if len(samples) > MAX_SAMPLES:
        return {"samples": f"at most {MAX_SAMPLES} samples per batch, not {len(samples)}"}
    errors = {}
    for n, sample in enumerate(samples):
        where = f"samples[{n}]"
        if not isinstance(sample, dict):
            errors[where] = "must be an object"
            continue
        for name, (types, nullable) in FIELDS.items():
            if name not in sample:
                if not nullable:
                    errors[f"{where}.{name}"] = "is required"
                continue
            problem = _problem(sample[name], types, nullable)
            if problem:
                errors[f"{where}.{name}"] = problem
        if isinstance(sample.get("kind"), str) and sample["kind"] not in KINDS:
            errors[f"{where}.kind"] = f"must be one of {', '.join(KINDS)}"
        if isinstance(sample.get("processes"), list) and not all(
            isinstance(p, dict) for p in sample["processes"]
        ):
            errors[f"{where}.processes"] = "must be a list of objects"
        if len(errors) >= 20:
            break
    return errors


def ingest(host: Host, samples: list[dict]) -> None:
    """Take a checked batch of one host's samples. Today: GPU health follows the latest GPU
    sample of each GPU (a GPU the agent no longer lists stays as the heartbeat left it)."""
    latest: dict[str, dict] = {}
    for sample in samples:
        uuid = sample.get("gpu_uuid")
        if sample["kind"] != "gpu" or not uuid:
            continue
        if uuid not in latest or sample["ts"] >= latest[uuid]["ts"]:
            latest[uuid] = sample
    if not latest:
        return
    now = timezone.now()
    gpus = Gpu.objects.filter(host=host, uuid__in=latest).only("pk", "uuid", "healthy")
    for gpu in gpus:
        healthy = latest[gpu.uuid]["healthy"]
        if gpu.healthy == healthy:
            continue
        reason = "" if healthy else "reported unhealthy by the agent's samples"
        # Compare-and-swap: a heartbeat that just set a precise reason is not overwritten.
        changed = Gpu.objects.filter(pk=gpu.pk, healthy=gpu.healthy).update(
            healthy=healthy, health_reason=reason, health_changed_at=now
        )
        if changed:
            log.log(
                logging.INFO if healthy else logging.WARNING,
                "%s/gpu%s is %s (samples)",
                host.name,
                latest[gpu.uuid]["gpu_index"],
                "healthy" if healthy else "unhealthy",
            )
