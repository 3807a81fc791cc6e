"""Where a host's batch of metric samples becomes live metrics.

`ingest_samples(host, samples)` takes a batch the agent API has authenticated and checked
(console.metrics.samples), and:

1. keeps only the samples of GPUs and MIG devices the console has in the host's inventory (as
   its heartbeats reported it): a host cannot invent series, and every label (the GPU's UUID,
   the MIG device's) comes from the console's records, not from the sample;
2. attributes each allocation sample to its instance and tenant (allocation id → Allocation →
   Instance, cached in this process: no query per sample, one per batch at most, for ids not
   seen before);
3. adds every sample to the live window and records the latest sample of each series
   (console.metrics.live);
4. publishes them to small Channels groups: one per instance (`metrics.instance.<id>`), one per
   tenant (`metrics.tenant.<id>`) and one per host (`metrics.host.<id>`): group_send costs grow
   with a group's size, so there is never one group for everybody.

Websocket frames are serialised once here, not once per viewer."""

import logging
import threading
import time
from collections import OrderedDict, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache

from console import broadcast
from console.fleet.models import Gpu, Host
from console.instances.models import Allocation
from console.metrics import live
from console.scheduler.model import MIG_SLICES

log = logging.getLogger(__name__)


def instance_group(instance_id: int) -> str:
    return f"metrics.instance.{instance_id}"


def tenant_group(tenant_id: int) -> str:
    return f"metrics.tenant.{tenant_id}"


def host_group(host_id: int) -> str:
    return f"metrics.host.{host_id}"


def instance_series(instance_id: int) -> str:
    return f"instance:{instance_id}"


def gpu_series(host_id: int, index: int) -> str:
    return f"gpu:{host_id}:{index}"


def mig_series(host_id: int, index: int, mig_uuid: str) -> str:
    return f"mig:{host_id}:{index}:{mig_uuid}"


@dataclass(frozen=True, slots=True)
class Attribution:
    """Whose an allocation's samples are."""

    allocation: str
    host_id: int
    instance_id: int
    instance_name: str
    tenant_id: int
    tenant: str  # the tenant's slug
    mode: str
    gpus: tuple[int, ...] = ()
    mig_size: int | None = None


class AllocationCache:
    """allocation id → Attribution, for this process.

    An allocation never changes instance, so a found one is kept (the least recently used go
    beyond MAX); an id the database does not know is asked again at most every MISS_SECONDS
    (an agent may report an allocation a moment before its row commits, or long after it is
    gone)."""

    MAX = 50_000
    MISS_SECONDS = 2.0

    def __init__(self):
        self._lock = threading.Lock()
        self._found: OrderedDict[str, Attribution] = OrderedDict()
        self._missed: dict[str, float] = {}
        self.queries = 0

    def resolve(self, ids: set[str]) -> dict[str, Attribution]:
        now = time.monotonic()
        found: dict[str, Attribution] = {}
        ask = set()
        with self._lock:
            for alloc_id in ids:
                attribution = self._found.get(alloc_id)
                if attribution is not None:
                    self._found.move_to_end(alloc_id)
                    found[alloc_id] = attribution
                elif now - self._missed.get(alloc_id, float("-inf")) >= self.MISS_SECONDS:
                    ask.add(alloc_id)
        if not ask:
            return found
        self.queries += 1
        rows = Allocation.objects.filter(pk__in=ask).values_list(
            "id",
            "host_id",
            "instance_id",
            "instance__name",
            "instance__tenant_id",
            "instance__tenant__slug",
            "mode",
            "request",
        )
        with self._lock:
            for alloc_id, host_id, inst, name, tenant_id, slug, mode, request in rows:
                request = request if isinstance(request, dict) else {}
                mig = request.get("mig") or {}
                attribution = Attribution(
                    allocation=alloc_id,
                    host_id=host_id,
                    instance_id=inst,
                    instance_name=name,
                    tenant_id=tenant_id,
                    tenant=slug,
                    mode=mode,
                    gpus=tuple(i for i in request.get("gpus") or () if isinstance(i, int)),
                    mig_size=mig.get("size") if isinstance(mig.get("size"), int) else None,
                )
                self._found[alloc_id] = attribution
                found[alloc_id] = attribution
                self._missed.pop(alloc_id, None)
                ask.discard(alloc_id)
            for alloc_id in ask:
                self._missed[alloc_id] = now
            while len(self._found) > self.MAX:
                self._found.popitem(last=False)
            if len(self._missed) > self.MAX:
                self._missed.clear()
        return found

    def clear(self) -> None:
        with self._lock:
            self._found.clear()
            self._missed.clear()
            self.queries = 0


allocations = AllocationCache()


@dataclass(frozen=True, slots=True)
class Device:
    """A GPU as the console knows it: its UUID and those of its MIG devices."""

    uuid: str
    mig: frozenset[str]


def mig_devices(devices) -> dict[str, dict]:
    """A Gpu row's `mig_devices` (as the agent's inventory reported them) by MIG UUID."""
    return {
        d["uuid"]: d
        for d in devices or []
        if isinstance(d, dict) and isinstance(d.get("uuid"), str)
    }


def inventory(host: Host, rows: Iterable | None = None) -> dict[int, Device]:
    """The host's GPUs by index, as its last synced heartbeat left them (from `rows`, the host's
    GPUs with their index, uuid and mig_devices, or one query)."""
    if rows is None:
        rows = Gpu.objects.filter(host=host).only("index", "uuid", "mig_devices")
    return {gpu.index: Device(gpu.uuid, frozenset(mig_devices(gpu.mig_devices))) for gpu in rows}


@dataclass
class Result:
    """What one batch became (for logs, tests and the benchmark)."""

    points: int = 0
    unknown: int = 0  # samples of a GPU or MIG device not in the host's inventory: left out
    unattributed: int = 0
    too_old: int = 0
    groups: list[str] = field(default_factory=list)


def _values(sample: dict) -> tuple:
    return tuple(map(sample.get, live.FIELDS))


def sample_frame(instance_id: int, sample: dict) -> str:
    return live.compact_json(
        {
            "type": "sample",
            "instance": instance_id,
            "ts": sample["ts"],
            "gpu_util": sample.get("gpu_util"),
            "mem_used_mib": sample.get("mem_used_mib"),
            "mem_total_mib": sample.get("mem_total_mib"),
            "temperature_c": sample.get("temperature_c"),
            "power_w": sample.get("power_w"),
        }
    )


def _with_parent_readings(sample: dict, parent: dict | None, owner: Attribution) -> dict:
    """A MIG slice has no temperature or power sensor of its own: it has its GPU's temperature,
    and the share of its GPU's power that its memory slices are (as the agent shares a
    time-sliced GPU's power by fraction)."""
    if parent is None or owner.mode != "mig":
        return sample
    filled = dict(sample)
    if filled.get("temperature_c") is None:
        filled["temperature_c"] = parent.get("temperature_c")
    if filled.get("power_w") is None and parent.get("power_w") is not None and owner.mig_size:
        filled["power_w"] = round(parent["power_w"] * owner.mig_size / MIG_SLICES, 1)
    return filled


@lru_cache(maxsize=65536)
def labels_json(
    host_id: int,
    hostname: str,
    kind: str,
    index: int,
    uuid: str,
    mig: str | None,
    healthy: bool,
    owner: Attribution | None,
) -> str:
    """The labels of a series' latest sample, as JSON: the same few per series, second after
    second, so each is written once per process (live.RedisWindow.add keeps them beside the
    sample's values)."""
    labels = {
        "kind": kind,
        "host": host_id,
        "hostname": hostname,
        "gpu": index,
        "uuid": uuid,
        "mig_uuid": mig,
        "healthy": healthy,
    }
    if owner is not None:
        labels.update(
            tenant=owner.tenant,
            tenant_id=owner.tenant_id,
            instance=owner.instance_id,
            mode=owner.mode,
        )
    return live.compact_json(labels)


def ingest_samples(
    host: Host, samples: list[dict], gpus: dict[int, Device] | None = None
) -> Result:
    """Attribute, keep and publish one checked batch of `host`'s samples (a Host, or what has its
    pk and name); `gpus` is the host's `inventory()` when the caller has read it already."""
    now = live.now()
    oldest = now - live.window_seconds()
    result = Result()
    samples = sorted(samples, key=lambda s: s["ts"])
    gpus = inventory(host) if gpus is None else gpus
    owners = allocations.resolve(
        {s["allocation"] for s in samples if s["kind"] == "allocation" and s.get("allocation")}
    )
    gpu_readings = {(s["gpu_index"], s["ts"]): s for s in samples if s["kind"] == "gpu"}

    points: list[live.Point] = []
    latest: dict[str, str] = {}  # series -> its labels (live.RedisWindow.add)
    whole_owner: dict[int, Attribution] = {}
    mig_owner: dict[str, Attribution] = {}
    instance_frames: dict[int, list] = defaultdict(list)
    tenant_frames: dict[int, list] = defaultdict(list)
    gpu_frames: list[dict] = []
    gpu_latest: dict[int, bool] = {}  # index -> healthy, as its latest sample says
    mig_latest: dict[str, tuple[int, str, bool]] = {}

    for sample in samples:
        ts = sample["ts"]
        if ts < oldest:
            # Older than the window (an agent's backlog after a long outage): its minute has been
            # downsampled from what arrived in time and is not mended from a part of it.
            result.too_old += 1
            continue
        kind = sample["kind"]
        gpu = gpus.get(sample["gpu_index"])
        mig = sample.get("mig_uuid")
        if gpu is None or sample.get("gpu_uuid") not in (None, gpu.uuid):
            result.unknown += 1  # not a GPU the console has at that index on this host
            continue
        if mig not in gpu.mig:
            if kind == "mig":
                result.unknown += 1
                continue
            mig = None  # an allocation's device the console does not know (yet): no label
        if kind == "gpu":
            points.append(live.Point(gpu_series(host.pk, sample["gpu_index"]), ts, _values(sample)))
            gpu_latest[sample["gpu_index"]] = sample.get("healthy", True)
            gpu_frames.append(
                {
                    "gpu": sample["gpu_index"],
                    "ts": ts,
                    "gpu_util": sample.get("gpu_util"),
                    "mem_used_mib": sample.get("mem_used_mib"),
                    "mem_total_mib": sample.get("mem_total_mib"),
                    "temperature_c": sample.get("temperature_c"),
                    "power_w": sample.get("power_w"),
                    "healthy": sample.get("healthy", True),
                }
            )
        elif kind == "mig":
            series = mig_series(host.pk, sample["gpu_index"], mig)
            points.append(live.Point(series, ts, _values(sample)))
            mig_latest[series] = (sample["gpu_index"], mig, sample.get("healthy", True))
        else:  # an allocation's own view of its slice
            owner = owners.get(sample.get("allocation") or "")
            if owner is None or owner.host_id != host.pk:
                # Unknown, or another host's allocation: nobody's, and never shown to anyone.
                result.unattributed += 1
                continue
            if owner.mode == "whole":
                for index in owner.gpus or (sample["gpu_index"],):
                    whole_owner[index] = owner
            elif owner.mode == "mig" and mig:
                mig_owner[mig] = owner
            sample = _with_parent_readings(
                sample, gpu_readings.get((sample["gpu_index"], ts)), owner
            )
            series = instance_series(owner.instance_id)
            points.append(live.Point(series, ts, _values(sample)))
            latest[series] = labels_json(
                host.pk, host.name, "allocation", sample["gpu_index"], gpu.uuid, mig,
                sample.get("healthy", True), owner,
            )  # fmt: skip
            frame = [ts, sample_frame(owner.instance_id, sample)]
            instance_frames[owner.instance_id].append(frame)
            tenant_frames[owner.tenant_id].append(frame)

    for index, healthy in gpu_latest.items():
        latest[gpu_series(host.pk, index)] = labels_json(
            host.pk, host.name, "gpu", index, gpus[index].uuid, None, healthy,
            whole_owner.get(index),
        )  # fmt: skip
    for series, (index, mig, healthy) in mig_latest.items():
        latest[series] = labels_json(
            host.pk, host.name, "mig", index, gpus[index].uuid, mig, healthy, mig_owner.get(mig)
        )

    result.points = len(points)
    messages = [
        (instance_group(inst), {"type": "metrics.frames", "frames": frames})
        for inst, frames in instance_frames.items()
    ]
    messages += [
        (tenant_group(tenant), {"type": "metrics.frames", "frames": frames})
        for tenant, frames in tenant_frames.items()
    ]
    if gpu_frames:
        frame = live.compact_json({"type": "gpus", "host": host.pk, "samples": gpu_frames})
        messages.append(
            (
                host_group(host.pk),
                {"type": "metrics.frames", "frames": [[gpu_frames[-1]["ts"], frame]]},
            )
        )
    store = live.store()
    wire = broadcast.pubsub_wire(messages) if isinstance(store, live.RedisWindow) else None
    if points or latest or wire:
        store.add(points, latest, now, publish=wire or ())
    if wire is None:
        for group, message in messages:
            broadcast.group_send(group, message)
    result.groups = [group for group, _ in messages]
    return result
