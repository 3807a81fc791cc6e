"""Where an agent's metric samples enter the control plane: `POST /agent/v1/samples`.

Every agent posts a batch each second, so this endpoint is the control plane's hottest path.
The endpoint is two plain functions: `authenticate` (the Authorization header, before a byte of
the body is read) and `accept_body` (the body, read by the caller into at most MAX_BODY_BYTES + 1
bytes). console/metrics/asgi.py serves them straight from the ASGI server (no middleware stack,
whose synchronous parts cost a thread hand-off each), and a small Django view (agent_api.py)
serves the same functions to anything that goes through the URLconf. `accept_body` checks the
batch (`check_batch`: types, ranges, finite numbers, `ts` near now) and `ingest`s it: GPU
health, then the metrics pipeline (live window, websockets, history, Prometheus). A malformed
batch gets a 400 with {"code", "detail"}, never a 500."""

import logging
import math
from dataclasses import dataclass
from typing import NamedTuple

import orjson
from django.utils import timezone

from console.errors import DomainError, ErrorCode
from console.fleet.models import Gpu
from console.fleet.services import host_rows_for_secret
from console.metrics import live
from console.metrics.ingest import ingest_samples, inventory

log = logging.getLogger(__name__)

MAX_SAMPLES = 20000
MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_PROCESSES = 1024
# A sample's `ts` may be this far behind the console's clock (an agent's backlog after an
# outage; what is older than the live window is then left out) or ahead of it (clock skew).
MAX_AGE_SECONDS = 24 * 3600
MAX_AHEAD_SECONDS = 300
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
# The readings a GPU can give (a whole-GPU allocation sums up to 8 GPUs' memory and power).
RANGES: dict[str, tuple[int, int]] = {
    "gpu_index": (0, 1023),  # as a heartbeat's inventory allows
    "gpu_util": (0, 100),
    "mem_used_mib": (0, 16 * 1024 * 1024),
    "mem_total_mib": (0, 16 * 1024 * 1024),
    "temperature_c": (-50, 200),
    "power_w": (0, 100_000),
    "sm_clock_mhz": (0, 100_000),
    "ecc_errors": (0, 2**53),
}
# As long as the console's own records of them may be (Gpu.uuid, Allocation.id).
LENGTHS = {"gpu_uuid": 80, "mig_uuid": 80, "allocation": 64}
TYPE_NAMES = {
    NUMBER: "a number",
    (int,): "an integer",
    (str,): "a string",
    (bool,): "true or false",
}


def _problem(name: str, value, types: tuple[type, ...], nullable: bool) -> str | None:
    if value is None:
        return None if nullable else "may not be null"
    if isinstance(value, bool) and bool not in types:
        return f"must be {TYPE_NAMES.get(types, types[0].__name__)}"
    if not isinstance(value, types):
        return f"must be {TYPE_NAMES.get(types, 'a ' + types[0].__name__)}"
    if isinstance(value, float) and not math.isfinite(value):
        return "must be a finite number"
    if name in RANGES:
        low, high = RANGES[name]
        if not low <= value <= high:
            return f"must be between {low} and {high}"
    if name in LENGTHS and len(value) > LENGTHS[name]:
        return f"must be at most {LENGTHS[name]} characters"
    return None


def _sample_problems(sample: dict, now: float) -> dict[str, str]:
    errors = {}
    for name, (types, nullable) in FIELDS.items():
        if name not in sample:
            if not nullable:
                errors[name] = "is required"
            continue
        problem = _problem(name, sample[name], types, nullable)
        if problem:
            errors[name] = problem
    if "ts" not in errors and not now - MAX_AGE_SECONDS <= sample["ts"] <= now + MAX_AHEAD_SECONDS:
        errors["ts"] = (
            f"must be within {MAX_AGE_SECONDS} s before and {MAX_AHEAD_SECONDS} s after the "
            f"console's clock ({now:.0f})"
        )
    if "kind" not in errors and sample["kind"] not in KINDS:
        errors["kind"] = f"must be one of {', '.join(KINDS)}"
    processes = sample.get("processes")
    if "processes" not in errors and processes is not None:
        if len(processes) > MAX_PROCESSES:
            errors["processes"] = f"at most {MAX_PROCESSES} processes"
        elif not all(isinstance(p, dict) for p in processes):
            errors["processes"] = "must be a list of objects"
    return errors


# FIELDS as the fast check reads them: (name, exact types, may be null, (low, high), length).
_EXACT = {NUMBER: frozenset({int, float}), (int,): frozenset({int}), (str,): frozenset({str}),
          (bool,): frozenset({bool}), (list,): frozenset({list})}  # fmt: skip
_RULES = tuple(
    (name, _EXACT[types], nullable, RANGES.get(name), LENGTHS.get(name))
    for name, (types, nullable) in FIELDS.items()
)
_MISSING = object()


def _sample_fine(sample: dict, now: float) -> bool:
    """True only when `_sample_problems` finds nothing, in a fraction of its time: the check of
    every sample of every batch (tests/metrics/test_sample_checks.py holds the two together).
    False says nothing: `_sample_problems` tells. A number with a range is finite when in it;
    `ts`, the one without, when near `now`."""
    for name, types, nullable, bounds, length in _RULES:
        value = sample.get(name, _MISSING)
        if value is None or value is _MISSING:
            if nullable:
                continue
            return False
        if type(value) not in types:
            return False
        if bounds is not None and not bounds[0] <= value <= bounds[1]:
            return False
        if length is not None and len(value) > length:
            return False
    processes = sample.get("processes")
    if processes is not None and (
        len(processes) > MAX_PROCESSES or not all(type(p) is dict for p in processes)
    ):
        return False
    return (
        now - MAX_AGE_SECONDS <= sample["ts"] <= now + MAX_AHEAD_SECONDS and sample["kind"] in KINDS
    )


def check_batch(samples, now: float | None = None) -> dict[str, str]:
    """Field errors of a batch, keyed like `samples[3].gpu_util`; empty when it is fine. Every
    number is finite and in its range and every `ts` near `now` (the console's clock): what
    passes here can be kept, downsampled, charted and exported."""
    if not isinstance(samples, list):
        return {"samples": "must be a list of samples"}
    if len(samples) > MAX_SAMPLES:
        return {"samples": f"at most {MAX_SAMPLES} samples per batch, not {len(samples)}"}
    now = live.now() if now is None else now
    errors = {}
    for n, sample in enumerate(samples):
        if type(sample) is dict and _sample_fine(sample, now):
            continue
        where = f"samples[{n}]"
        if not isinstance(sample, dict):
            errors[where] = "must be an object"
        else:
            errors.update(
                (f"{where}.{name}", problem)
                for name, problem in _sample_problems(sample, now).items()
            )
        if len(errors) >= 20:
            break
    return errors


class BatchRefused(DomainError):
    """A batch not taken: the HTTP status and the JSON answer the agent gets."""

    code = ErrorCode.INVALID
    status = 400

    @property
    def answer(self) -> dict:
        return {"code": self.code, "detail": self.detail}


class GpuRow(NamedTuple):
    """What a batch needs of one of the host's GPUs."""

    pk: int
    index: int
    uuid: str
    healthy: bool
    mig_devices: list


@dataclass(frozen=True, slots=True)
class AgentHost:
    """The host an agent's secret names, with its GPUs as its heartbeats left them: all read in
    one query when the secret is checked."""

    pk: int
    name: str
    gpus: tuple[GpuRow, ...]


def authenticate(authorization: str) -> AgentHost:
    """The host whose secret the Authorization header carries; checked before a byte of the
    body is read."""
    keyword, _, secret = authorization.partition(" ")
    if keyword.lower() != "bearer" or not secret.strip():
        raise BatchRefused(
            "Authorization must be 'Bearer <host secret>'.",
            code=ErrorCode.NOT_AUTHENTICATED,
            status=401,
        )
    rows = host_rows_for_secret(secret.strip(), *(f"gpus__{name}" for name in GpuRow._fields))
    if not rows:
        raise BatchRefused("Invalid host secret.", code=ErrorCode.INVALID_SECRET, status=401)
    pk, name = rows[0][:2]
    return AgentHost(pk, name, tuple(GpuRow(*row[2:]) for row in rows if row[2] is not None))


def too_large() -> BatchRefused:
    detail = f"A batch is at most {MAX_BODY_BYTES} bytes."
    return BatchRefused(detail, code=ErrorCode.TOO_LARGE, status=413)


def accept_body(host: AgentHost, body: bytes) -> tuple[int, dict]:
    """(HTTP status, JSON answer) for an authenticated host's body."""
    try:
        return 202, _accept(host, body)
    except BatchRefused as refused:
        return refused.status, refused.answer


def _accept(host: AgentHost, body: bytes) -> dict:
    if len(body) > MAX_BODY_BYTES:
        raise too_large()
    try:
        # orjson: a quarter of json's time. It refuses NaN, Infinity, numbers past a double's
        # range, lone surrogates and nesting past 1,024 levels, each as not JSON; an integer
        # past 64 bits it reads as a float, which no field's check lets through
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BatchRefused(f"The body is not JSON: {exc}", code=ErrorCode.PARSE_ERROR) from None
    if not isinstance(data, dict):
        raise BatchRefused("The body must be a JSON object.", code=ErrorCode.PARSE_ERROR)
    host_id = data.get("host_id")
    if not isinstance(host_id, int) or isinstance(host_id, bool):
        raise BatchRefused("host_id: must be an integer")
    if host_id != host.pk:
        detail = f"This secret belongs to host {host.pk} ({host.name}), not {host_id}."
        raise BatchRefused(detail, code=ErrorCode.WRONG_HOST, status=403)
    errors = check_batch(data.get("samples"))
    if errors:
        raise BatchRefused("; ".join(f"{k}: {v}" for k, v in errors.items()))
    ignored = ingest(host, data["samples"])
    return {"accepted": len(data["samples"]) - ignored, "ignored": ignored}


def ingest(host: AgentHost, samples: list[dict]) -> int:
    """Take a checked batch of one host's samples: GPU health follows the latest GPU sample of
    each GPU (a GPU the agent no longer lists stays as the heartbeat left it), and the metrics
    pipeline gets the batch. Answer how many samples it left out (of devices the host's
    inventory does not have)."""
    ignored = ingest_samples(host, samples, inventory(host, host.gpus)).unknown
    latest: dict[str, dict] = {}
    for sample in samples:
        uuid = sample.get("gpu_uuid")
        if sample["kind"] != "gpu" or not uuid:
            continue
        if uuid not in latest or sample["ts"] >= latest[uuid]["ts"]:
            latest[uuid] = sample
    if not latest:
        return ignored
    now = timezone.now()
    for gpu in (row for row in host.gpus if row.uuid in latest):
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
    return ignored
