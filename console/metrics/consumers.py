"""Live metrics over websockets.

- /ws/instances/<id>/metrics/       a tenant member: the instance's recent window, then every new
                                    sample as {"type": "sample", "instance", "ts", "gpu_util",
                                    "mem_used_mib", "mem_total_mib", "temperature_c", "power_w"}
- /ws/metrics/                      a tenant member: every sample of the tenant's instances
- /ws/fleet/metrics/                operators: every GPU of every host, for the heatmap
- /ws/fleet/hosts/<id>/metrics/     operators: one host's GPUs, their window, then every sample

A socket that may not see what it asks for is refused at the handshake (close before accept),
so it never gets a single sample."""

import asyncio
import json

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from accounts import scopes
from accounts.websocket import StandingAccess, StandingOperator, operator_socket, reading_member
from console.fleet.models import Gpu, Host
from console.instances.models import Instance
from console.metrics import live
from console.metrics.ingest import (
    gpu_series,
    host_group,
    instance_group,
    instance_series,
    tenant_group,
)

# How often a fleet socket looks for hosts that joined.
HOSTS_REFRESH_SECONDS = 30.0
FORBIDDEN = 4403
NOT_FOUND = 4404


def _dumps(data) -> str:
    return json.dumps(data, separators=(",", ":"))


def _sample(row: list) -> dict:
    data = live.as_dict(row)
    data.pop("sm_clock_mhz", None)
    return data


def _reader(method):
    """A live-window read, off the event loop (Redis or the in-process window)."""
    return sync_to_async(method, thread_sensitive=False)


@database_sync_to_async
def _tenant_instance(instance_id: int, tenant_id: int, name_prefix: str) -> bool:
    found = Instance.objects.filter(pk=instance_id, tenant_id=tenant_id)
    return found.filter(name__startswith=name_prefix).exists()


class _FramesConsumer(AsyncWebsocketConsumer):
    """Relays pre-serialised frames from its groups, each at most once and in ts order."""

    groups_joined: list[str]
    since = float("-inf")

    async def join(self, *groups: str) -> None:
        if not hasattr(self, "groups_joined") or self.groups_joined is None:
            self.groups_joined = []
        for group in groups:
            if group not in self.groups_joined:
                await self.channel_layer.group_add(group, self.channel_name)
                self.groups_joined.append(group)

    async def disconnect(self, code):
        for group in getattr(self, "groups_joined", None) or []:
            await self.channel_layer.group_discard(group, self.channel_name)
        self.groups_joined = []

    async def receive(self, text_data=None, bytes_data=None):
        if text_data and '"ping"' in text_data:
            await self.send(_dumps({"type": "pong"}))

    async def allowed_still(self) -> bool:
        return True

    async def dispatch(self, message):
        # Frames go straight out. Channels' dispatch first closes stale database connections
        # in the one thread that every socket of the process shares (a thread hop per frame
        # per socket, queued behind all the others'); relaying touches no database, and the
        # access check, when due, closes them itself (database_sync_to_async).
        if message["type"] == "metrics.frames":
            await self.metrics_frames(message)
        else:
            await super().dispatch(message)

    async def metrics_frames(self, event):
        if not await self.allowed_still():
            await self.close(code=FORBIDDEN)
            return
        for ts, text in event["frames"]:
            if ts > self.since:
                self.since = ts
                await self.send(text_data=text)


class _TenantConsumer(_FramesConsumer):
    access: StandingAccess

    async def allowed_still(self) -> bool:
        return await self.access.holds()


class InstanceMetricsConsumer(_TenantConsumer):
    async def connect(self):
        self.groups_joined = []
        instance_id = int(self.scope["url_route"]["kwargs"]["instance_id"])
        membership = reading_member(self.scope, "metrics:read", whole_tenant=False)
        if membership is None:
            await self.close(code=FORBIDDEN)
            return
        prefix = scopes.instance_prefix(membership)
        if not await _tenant_instance(instance_id, membership.tenant_id, prefix):
            await self.close(code=NOT_FOUND)  # another tenant's, or none: the same answer
            return
        self.access = StandingAccess(self.scope)
        # Join first, then read the window: a sample published meanwhile is in both, and
        # `since` lets it through once.
        await self.join(instance_group(instance_id))
        await self.accept()
        window = live.window_seconds()
        rows = await _reader(live.store().window)(instance_series(instance_id), live.now() - window)
        await self.send(
            _dumps(
                {
                    "type": "window",
                    "instance": instance_id,
                    "window_seconds": window,
                    "samples": [_sample(row) for row in rows],
                }
            )
        )
        if rows:
            self.since = rows[-1][0]


class TenantMetricsConsumer(_TenantConsumer):
    """Every sample of every instance of the socket's tenant (no window)."""

    async def connect(self):
        self.groups_joined = []
        membership = reading_member(self.scope, "metrics:read")
        if membership is None:
            await self.close(code=FORBIDDEN)
            return
        self.access = StandingAccess(self.scope)
        await self.join(tenant_group(membership.tenant_id))
        await self.accept()
        await self.send(_dumps({"type": "hello", "tenant": membership.tenant.slug}))

    async def metrics_frames(self, event):
        # Samples of several instances: each its own order.
        if not await self.allowed_still():
            await self.close(code=FORBIDDEN)
            return
        for _ts, text in event["frames"]:
            await self.send(text_data=text)


@database_sync_to_async
def _fleet() -> list[dict]:
    hosts = []
    gpus: dict[int, list] = {}
    for gpu in Gpu.objects.filter(host__status__in=_LISTED).order_by("index"):
        gpus.setdefault(gpu.host_id, []).append(
            {
                "index": gpu.index,
                "uuid": gpu.uuid,
                "name": gpu.name,
                "mode": gpu.mode,
                "healthy": gpu.healthy,
                "health_reason": gpu.health_reason,
            }
        )
    for host in Host.objects.filter(status__in=_LISTED).order_by("name"):
        hosts.append(
            {"id": host.pk, "name": host.name, "status": host.status, "gpus": gpus.get(host.pk, [])}
        )
    return hosts


_LISTED = [s for s in Host.Status.values if s != Host.Status.RETIRED]


def _latest_gpus(latest: dict[str, dict]) -> list[dict]:
    return [
        {
            "host": value["host"],
            "gpu": value["gpu"],
            "ts": value["ts"],
            "gpu_util": value.get("gpu_util"),
            "mem_used_mib": value.get("mem_used_mib"),
            "mem_total_mib": value.get("mem_total_mib"),
            "temperature_c": value.get("temperature_c"),
            "power_w": value.get("power_w"),
            "healthy": value.get("healthy", True),
        }
        for value in latest.values()
        if value.get("kind") == "gpu"
    ]


class _OperatorConsumer(_FramesConsumer):
    """Closes (4403) once its user is no longer an active operator."""

    access: StandingOperator

    async def allowed_still(self) -> bool:
        return await self.access.holds()

    async def connect_operator(self) -> bool:
        if not operator_socket(self.scope):
            await self.close(code=FORBIDDEN)
            return False
        self.access = StandingOperator(self.scope)
        return True


class FleetMetricsConsumer(_OperatorConsumer):
    """Operators' heatmap: joins every host's (small) group rather than one fleet-wide one."""

    refresher = None

    async def connect(self):
        self.groups_joined = []
        if not await self.connect_operator():
            return
        hosts = await _fleet()
        await self.join(*[host_group(h["id"]) for h in hosts])
        await self.accept()
        latest = await _reader(live.store().latest)()
        await self.send(_dumps({"type": "fleet", "hosts": hosts, "latest": _latest_gpus(latest)}))
        self.refresher = asyncio.ensure_future(self._refresh())

    async def _refresh(self):
        while True:
            await asyncio.sleep(HOSTS_REFRESH_SECONDS)
            if not await self.allowed_still():
                await self.close(code=FORBIDDEN)
                return
            hosts = await _fleet()
            known = set(self.groups_joined)
            if any(host_group(h["id"]) not in known for h in hosts):
                await self.join(*[host_group(h["id"]) for h in hosts])
                await self.send(_dumps({"type": "fleet", "hosts": hosts, "latest": []}))

    async def disconnect(self, code):
        if self.refresher is not None:
            self.refresher.cancel()
        await super().disconnect(code)

    async def metrics_frames(self, event):
        if not await self.allowed_still():
            await self.close(code=FORBIDDEN)
            return
        for _ts, text in event["frames"]:  # hosts' batches: each host its own order
            await self.send(text_data=text)


@database_sync_to_async
def _host_gpus(host_id: int) -> list[int] | None:
    if not Host.objects.filter(pk=host_id).exists():
        return None
    return list(
        Gpu.objects.filter(host_id=host_id).order_by("index").values_list("index", flat=True)
    )


class HostMetricsConsumer(_OperatorConsumer):
    """Operators: one host's GPUs, the window of each, then every batch."""

    async def connect(self):
        self.groups_joined = []
        host_id = int(self.scope["url_route"]["kwargs"]["host_id"])
        if not await self.connect_operator():
            return
        indices = await _host_gpus(host_id)
        if indices is None:
            await self.close(code=NOT_FOUND)
            return
        await self.join(host_group(host_id))
        await self.accept()
        names = [gpu_series(host_id, index) for index in indices]
        since = live.now() - live.window_seconds()
        windows = await _reader(live.store().windows)(names, since)
        gpus = {
            str(index): [_sample(row) for row in windows[name]]
            for index, name in zip(indices, names, strict=True)
        }
        await self.send(_dumps({"type": "window", "host": host_id, "gpus": gpus}))
        self.since = max((rows[-1]["ts"] for rows in gpus.values() if rows), default=self.since)
