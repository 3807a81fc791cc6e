"""Where an agent's metric samples enter the control plane: `POST /agent/v1/samples`.

Every agent posts a batch each second, so this endpoint is the control plane's hottest path.
`accept_batch` is the whole endpoint as a plain function: console/asgi.py serves it straight
from the ASGI server (no middleware stack, whose synchronous parts cost a thread hand-off each),
and a small Django view serves the same function to anything that goes through the URLconf.
It authenticates the host, checks the batch (`check_batch`), and `ingest`s it: GPU health, then
the metrics pipeline (live window, websockets, history, Prometheus)."""

import json
import logging

from django.utils import timezone

from console.fleet.models import Gpu, Host
from console.fleet.services import host_for_secret
from console.metrics.ingest import ingest_samples

log = logging.getLogger(__name__)

MAX_SAMPLES = 20000
MAX_BODY_BYTES = 16 * 1024 * 1024
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


def _error(status: int, code: str, detail: str) -> tuple[int, dict]:
    return status, {"code": code, "detail": detail}


def accept_batch(authorization: str, body: bytes) -> tuple[int, dict]:
    """The samples endpoint: (HTTP status, JSON answer) for an Authorization header and a body."""
    keyword, _, secret = authorization.partition(" ")
    if keyword.lower() != "bearer" or not secret.strip():
        return _error(401, "not_authenticated", "Authorization must be 'Bearer <host secret>'.")
    host = host_for_secret(secret.strip())
    if host is None:
        return _error(401, "invalid_secret", "Invalid host secret.")
    if len(body) > MAX_BODY_BYTES:
        return _error(413, "too_large", f"A batch is at most {MAX_BODY_BYTES} bytes.")
    try:
        data = json.loads(body)
    except ValueError:
        return _error(400, "parse_error", "The body is not JSON.")
    if not isinstance(data, dict):
        return _error(400, "parse_error", "The body must be a JSON object.")
    host_id = data.get("host_id")
    if not isinstance(host_id, int) or isinstance(host_id, bool):
        return _error(400, "invalid", "host_id: must be an integer")
    if host_id != host.pk:
        detail = f"This secret belongs to host {host.pk} ({host.name}), not {host_id}."
        return _error(403, "wrong_host", detail)
    errors = check_batch(data.get("samples"))
    if errors:
        return _error(400, "invalid", "; ".join(f"{k}: {v}" for k, v in errors.items()))
    ingest(host, data["samples"])
    return 202, {"accepted": len(data["samples"])}


def ingest(host: Host, samples: list[dict]) -> None:
    """Take a checked batch of one host's samples: GPU health follows the latest GPU sample of
    each GPU (a GPU the agent no longer lists stays as the heartbeat left it), and the metrics
    pipeline gets the batch."""
    ingest_samples(host, samples)
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
