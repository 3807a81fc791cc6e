"""One GPU host: its GPU backend, its workload runtime, and the allocations placed on it."""

import asyncio
import contextlib
import hashlib
import json
import logging
import os

from agent import AGENT_VERSION
from agent.allocations import (
    ID_PATTERN,
    LIMITS,
    MODES,
    VOLUME_PATTERN,
    Allocation,
    check_id,
    cuda_env,
    now_iso,
    parse_limits,
    parse_registry_auth,
    parse_spec,
)
from agent.backends import GpuBackend
from agent.errors import ApiError, conflict, invalid
from agent.fit import check_placement
from agent.gpu_models import mig_profiles
from agent.image_store import parse_settings
from agent.runtimes import Exit, LaunchError, Runtime
from agent.runtimes.output import claim_output
from agent.state import StateStore
from agent.volumes import DiskError

log = logging.getLogger(__name__)

# How long a PUT, start or reboot waits for its workload to run before it answers `starting`
# (an image being pulled); the outcome then reaches the console as an event.
LAUNCH_WAIT_SECONDS = 5.0
MAX_LOG_LINES = 10_000


def digest(document: dict) -> str:
    """sha256 of a document's canonical JSON (sorted keys, no spaces)."""
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def memory_mib() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)


def _over_cap(sample: dict) -> bool:
    used, total = sample["mem_used_mib"], sample["mem_total_mib"]
    return used is not None and total is not None and used > total


class LocalHost:
    """This machine as its agent runs it: the GPUs (backend), the workloads (runtime) and
    the allocations it holds. The console's record of it is console.fleet.models.Host."""

    def __init__(
        self,
        hostname: str,
        backend: GpuBackend,
        runtime: Runtime,
        store: StateStore,
        cpu_count: int | None = None,
        memory: int | None = None,
        launch_wait: float = LAUNCH_WAIT_SECONDS,
    ):
        """`cpu_count` and `memory` (MiB) are the capacity offered to workloads; by default
        this machine's. `listeners` are called with every event the console must hear of at
        once (a workload that exited, a launch that ended after its request was answered,
        an image pull's progress)."""
        self.hostname = hostname
        self.cpu_count = cpu_count or os.cpu_count()
        self.memory_mib = memory or memory_mib()
        self.backend = backend
        self.runtime = runtime
        self.store = store
        self.allocations: dict[str, Allocation] = {}
        self._locks: dict[str, list] = {}  # allocation id -> [lock, holders and waiters]
        self.gpu_modes: dict[int, str] = {}  # modes set through the API; they outlast restarts
        self.launch_wait = launch_wait
        self.ssh: dict | None = None  # the SSH gateway's port, host key and its certificate
        self.gateway = None  # the SSH gateway (agent/ssh.py), when it runs
        self.ssh_keys: dict[str, list[dict]] = store.load_ssh_keys()  # instance -> its keys
        self.listeners: list = []
        # called with (instance, keys, members) when its access is pushed (agent/terminals.py)
        self.key_listeners: list = []
        self._launches: dict[str, asyncio.Task] = {}
        images = getattr(runtime, "images", None)
        if images is not None:
            images.in_use = self._images_in_use  # never removed to make room

    def inventory(self) -> dict:
        inventory = {
            "hostname": self.hostname,
            "agent_version": AGENT_VERSION,
            "backend": self.backend.name,
            "runtime": self.runtime.name,
            "cpu_count": self.cpu_count,
            "memory_mib": self.memory_mib,
            "gpus": self.backend.gpus(),
            "ssh": self.ssh,
        }
        images = getattr(self.runtime, "images", None)  # the oci runtime's (agent/image_store.py)
        if images is not None:
            inventory.update(images.inventory())
        networks = getattr(self.runtime, "networks", None)  # the oci runtime's (agent/networks.py)
        if networks is not None:
            inventory["container_networks"] = sorted(networks.subnets)
        return {**inventory, "digest": digest(inventory)}

    def _image_store(self):
        images = getattr(self.runtime, "images", None)
        if images is None:
            raise conflict(
                "no_images", f"this host runs workloads as {self.runtime.name}: it holds no images"
            )
        return images

    def configure_images(self, body) -> dict:
        """The console's image settings (the references to pre-pull, the region's registry
        mirror): kept, and the pre-pulls started; ApiError 409 on a runtime without images."""
        return self._image_store().configure(*parse_settings(body))

    def _images_in_use(self) -> set[str]:
        return {a.spec["image"] for a in list(self.allocations.values()) if a.spec.get("image")}

    async def clean_up_images(self) -> dict:
        """Remove the images the agent pulled that no allocation here uses and that are not
        to be pre-pulled (agent/image_store.py)."""
        images = self._image_store()
        return await asyncio.to_thread(images.clean_up, self._images_in_use())

    async def refresh_images(self) -> None:
        """Read the engine's images again, and make room on its disk when it is short
        (agent/image_store.py), outside the event loop (none to read: nothing)."""
        images = getattr(self.runtime, "images", None)
        if images is not None:
            await asyncio.to_thread(images.refresh)
            await asyncio.to_thread(images.make_room)

    def views(self) -> list[dict]:
        return [alloc.view() for alloc in self.allocations.values()]

    def _save(self) -> None:
        self.store.save_allocations(list(self.allocations.values()))

    @contextlib.asynccontextmanager
    async def _lock(self, alloc_id: str):
        """Serialize the operations on one allocation; the others go on meanwhile."""
        entry = self._locks.setdefault(alloc_id, [asyncio.Lock(), 0])
        entry[1] += 1
        try:
            async with entry[0]:
                yield
        finally:
            entry[1] -= 1
            if entry[1] == 0:
                del self._locks[alloc_id]

    def _get(self, alloc_id: str) -> Allocation:
        check_id(alloc_id)
        alloc = self.allocations.get(alloc_id)
        if alloc is None:
            raise ApiError(404, "not_found", f"no allocation {alloc_id}")
        return alloc

    def restore(self) -> None:
        """Take back the GPU modes and allocations of a previous run: sim workloads as they
        were, process workloads whose process still runs; the others are lost."""
        count = len(self.backend.gpus())
        for index, mode in self.store.load_gpu_modes().items():
            if index < count:
                try:
                    self.backend.set_mode(index, mode)
                except ApiError as exc:
                    log.warning("GPU %d stays in its --mode: %s", index, exc.detail)
                    continue
                self.gpu_modes[index] = mode
                log.info("GPU %d: %s mode, as set through the API", index, mode)
        gpus = self.backend.gpus()
        for alloc in self.store.load_allocations():
            self.allocations[alloc.id] = alloc
            reason = self._reattach(alloc, gpus)
            if reason:
                self.runtime.kill(alloc)
                self._ended(alloc, "lost", reason)
            log.info("allocation %s restored: %s", alloc.id, alloc.state)
        self._save()

    def _reattach(self, alloc: Allocation, gpus: list[dict]) -> str | None:
        """Why an allocation of a previous run cannot be taken back, or None when it is."""
        if any(index >= len(gpus) for index in alloc.gpus):
            return "gpu_missing"
        if alloc.mode == "mig":
            mig = alloc.spec["mig"]
            profile = mig_profiles(gpus[alloc.gpus[0]]["model"]).get(mig["profile"])
            if profile is None:
                return "mig_device_missing"
            try:
                alloc.mig_uuid = self.backend.ensure_mig(alloc.gpus[0], profile, mig["start"])
            except ApiError as exc:
                log.warning("allocation %s: %s", alloc.id, exc.detail)
                return "mig_device_missing"
        if alloc.state in ("running", "starting") and not self.runtime.adopt(alloc):
            return "agent_restarted"
        if alloc.state == "starting":
            alloc.set_state("running")
        return None

    def running_allocation(self, instance: str) -> Allocation:
        """The instance's running allocation here; ApiError 404 when it has none, 409 when
        this host's runtime has no containers to enter."""
        check_id(instance)
        if not hasattr(self.runtime, "exec_open"):
            raise conflict(
                "no_containers", f"this host runs workloads as {self.runtime.name}, not containers"
            )
        for alloc in self.allocations.values():
            if alloc.instance == instance and alloc.state == "running":
                return alloc
        raise ApiError(404, "not_running", f"instance {instance} is not running here")

    def set_ssh_keys(
        self, instance: str, keys: list[dict], members: set[str] | None = None
    ) -> None:
        """The keys that may open SSH sessions into the instance, and the members who may hold
        its terminals (None: not said); both checked by the caller."""
        check_id(instance)
        self.ssh_keys[instance] = keys
        self.store.save_ssh_keys(self.ssh_keys)
        log.info("instance %s: %d SSH key(s)", instance, len(keys))
        for listener in self.key_listeners:
            listener(instance, keys, members)

    def session_event(self, instance: str, message: str, activity: str = "") -> None:
        """An SSH session began or ended: an event for the console. `activity` says which for
        the console's idle watch: "ssh.opened", "ssh.ended" (or nothing)."""
        for alloc in self.allocations.values():
            if alloc.instance == instance:
                self._emit(alloc, "session", message, activity)
                return

    def _emit_progress(self, alloc: Allocation, message: str, pull: dict | None) -> None:
        """A progress event; an image pull's carries its figures too (`pull`)."""
        self._emit(alloc, "progress", message, pull=pull)

    def _emit(
        self,
        alloc: Allocation,
        kind: str = "state",
        message: str = "",
        activity: str = "",
        pull: dict | None = None,
    ) -> None:
        event: dict[str, object] = {
            "allocation": alloc.id,
            "instance": alloc.instance,
            "kind": kind,
        }
        if activity:
            event["activity"] = activity
        if kind == "state":
            event.update(
                state=alloc.state,
                reason=alloc.reason,
                exit_code=alloc.exit_code,
                image_digest=alloc.image_digest or "",
                at=alloc.finished_at or alloc.updated_at,
                message=message,
            )
        else:
            event.update(at=now_iso(), message=message)
        if pull is not None:
            event["pull"] = pull
        for listener in self.listeners:
            listener(event)

    def _ended(
        self, alloc: Allocation, state: str, reason=None, exit_code=None, finished_at=None
    ) -> None:
        alloc.pid = alloc.pid_start = None
        alloc.set_state(state, reason, exit_code, finished_at)
        detail = reason or (f"exit code {exit_code}" if exit_code is not None else "")
        log.info("allocation %s: %s %s", alloc.id, state, detail)

    def _progress(self, alloc: Allocation):
        """A callback for the runtime's worker thread: progress of a launch, as an event."""
        loop = asyncio.get_running_loop()

        def report(message: str, pull: dict | None = None) -> None:
            log.info("allocation %s: %s", alloc.id, message)
            loop.call_soon_threadsafe(self._emit_progress, alloc, message, pull)

        return report

    async def _launch(self, alloc: Allocation) -> None:
        spec = alloc.spec
        env = {**spec["env"], **alloc.env, "GPUCLOUD_ALLOCATION_ID": alloc.id}
        alloc.set_state("starting")
        try:
            alloc.pid, alloc.pid_start = await asyncio.to_thread(
                self.runtime.launch, alloc, spec["command"], env, self._progress(alloc)
            )
        except LaunchError as exc:
            self._ended(alloc, "failed", str(exc))
        except Exception as exc:  # a bug must not leave it `starting` for ever
            log.exception("allocation %s: the launch failed", alloc.id)
            self._ended(alloc, "failed", f"launch_failed: {exc.__class__.__name__}: {exc}")
        else:
            alloc.set_state("running")
        finally:
            alloc.pull_auth = None  # for that one pull
        self._save()

    async def _start_workload(self, alloc: Allocation) -> None:
        """Launch the workload and wait for it at most `launch_wait` seconds; a launch that
        takes longer (a pull) goes on, answered `starting`, and its outcome is an event."""
        task = asyncio.create_task(self._launch(alloc))
        self._launches[alloc.id] = task
        task.add_done_callback(lambda _: self._launches.pop(alloc.id, None))
        done, _ = await asyncio.wait({task}, timeout=self.launch_wait)
        if not done:
            task.add_done_callback(lambda _: self._emit(alloc))

    async def _settled(self, alloc: Allocation) -> None:
        """Wait for a launch still under way (a stop or delete comes after it)."""
        task = self._launches.get(alloc.id)
        if task is not None:
            await asyncio.shield(task)

    def _check_healthy(self, alloc: Allocation) -> None:
        gpus = self.backend.gpus()
        for index in alloc.gpus:
            if not gpus[index]["healthy"]:
                raise conflict(
                    "gpu_unhealthy", f"GPU {index} is unhealthy: {gpus[index]['health_reason']}"
                )

    async def put(self, alloc_id: str, body) -> tuple[bool, Allocation]:
        """Create an allocation; answer (created, allocation). Same id and body: the existing
        one; same id, another body: 409."""
        check_id(alloc_id)
        gpus = self.backend.gpus()
        if isinstance(body, dict):  # the pull's credential: no part of the spec, never saved
            body = dict(body)
            pull_auth = parse_registry_auth(body.pop("registry_auth", None))
        else:
            pull_auth = None
        spec = parse_spec(body, gpus)
        async with self._lock(alloc_id):
            existing = self.allocations.get(alloc_id)
            if existing is not None:
                if existing.spec != spec:
                    raise conflict(
                        "allocation_conflict", f"allocation {alloc_id} exists with another body"
                    )
                return False, existing
            check_placement(spec, gpus, list(self.allocations.values()))
            mig_uuid = None
            if spec["mode"] == "mig":
                index, mig = spec["gpus"][0], spec["mig"]
                profile = mig_profiles(gpus[index]["model"])[mig["profile"]]
                mig_uuid = self.backend.ensure_mig(index, profile, mig["start"])
            gpu_uuids = [gpus[index]["uuid"] for index in spec["gpus"]]
            stamp = now_iso()
            alloc = Allocation(
                id=alloc_id,
                spec=spec,
                gpu_uuids=gpu_uuids,
                mig_uuid=mig_uuid,
                env=cuda_env(spec, gpu_uuids, mig_uuid),
                state="starting",
                created_at=stamp,
                updated_at=stamp,
                pull_auth=pull_auth,
            )
            if spec.get("volume"):
                claim_output(self.store.log_dir, alloc.instance, spec["volume"]["name"])
            self.allocations[alloc_id] = alloc
            self._save()
            await self._start_workload(alloc)
            log.info("allocation %s created on GPU %s: %s", alloc_id, spec["gpus"], alloc.state)
            return True, alloc

    async def _halt(self, alloc: Allocation) -> None:
        await self._settled(alloc)
        if alloc.state == "running":
            code = await self.runtime.stop(alloc)
            self._ended(alloc, "stopped", exit_code=code)
        else:
            self._ended(alloc, "stopped", exit_code=alloc.exit_code)

    async def stop(self, alloc_id: str) -> Allocation:
        async with self._lock(alloc_id):
            alloc = self._get(alloc_id)
            if alloc.state != "stopped":
                await self._halt(alloc)
                self._save()
            return alloc

    async def start(self, alloc_id: str) -> Allocation:
        async with self._lock(alloc_id):
            alloc = self._get(alloc_id)
            await self._settled(alloc)
            if alloc.state != "running":
                self._check_healthy(alloc)
                await self._start_workload(alloc)
            return alloc

    async def reboot(self, alloc_id: str) -> Allocation:
        async with self._lock(alloc_id):
            alloc = self._get(alloc_id)
            self._check_healthy(alloc)
            await self._halt(alloc)
            await self._start_workload(alloc)
            return alloc

    async def set_limits(self, alloc_id: str, body) -> Allocation:
        """A live resize: the workload's CPU, memory and pids limits change while it runs (the
        engine updates its container; nothing restarts), and are those of its later starts.
        ApiError 409 `limits_refused` when the engine cannot apply them."""
        limits = parse_limits(body)
        async with self._lock(alloc_id):
            alloc = self._get(alloc_id)
            await self._settled(alloc)
            kept = {k: v for k, v in (alloc.spec["resources"] or {}).items() if k not in LIMITS}
            resources = {**kept, **limits}
            if alloc.state == "running":
                await asyncio.to_thread(self.runtime.set_limits, alloc, resources)
            alloc.spec["resources"] = resources
            self._save()
            log.info("allocation %s: limits now %s", alloc_id, limits)
            return alloc

    async def delete(self, alloc_id: str) -> None:
        """Stop the workload and free its slice; nothing to do for an unknown id."""
        check_id(alloc_id)
        async with self._lock(alloc_id):
            alloc = self.allocations.get(alloc_id)
            if alloc is None:
                return
            await self._settled(alloc)
            if alloc.state == "running":
                await self.runtime.stop(alloc)
            if alloc.container:  # a launch that failed before its container left nothing
                await asyncio.to_thread(self.runtime.remove, alloc)
            if alloc.mig_uuid:
                self.backend.release_mig(alloc.gpus[0], alloc.mig_uuid)
            del self.allocations[alloc_id]
            self._save()
            log.info("allocation %s deleted", alloc_id)

    async def logs(self, instance: str, tail: int) -> list[str]:
        """The output of the instance's workloads on this host, most recent last."""
        check_id(instance)
        if not 1 <= tail <= MAX_LOG_LINES:
            raise invalid(f"tail must be between 1 and {MAX_LOG_LINES}, not {tail}")
        mine = [a for a in self.allocations.values() if a.instance == instance]
        return await asyncio.to_thread(self.runtime.logs, instance, mine, tail)

    async def delete_instance(self, instance: str) -> None:
        """Remove what outlives an instance's allocations here: its volume and its output."""
        check_id(instance)
        held = [a.id for a in self.allocations.values() if a.instance == instance]
        if held:
            raise conflict(
                "instance_busy", f"instance {instance} still has allocation(s) {', '.join(held)}"
            )
        await asyncio.to_thread(self.runtime.delete_instance, instance)
        if self.ssh_keys.pop(instance, None) is not None:
            self.store.save_ssh_keys(self.ssh_keys)
        log.info("instance %s: volume, logs and SSH keys deleted", instance)

    async def adopt_volume(self, name: str, body) -> None:
        """An instance's disk kept at its terminate becomes a volume's: body `{"instance",
        "owner", "tenant"}` (the instance it was made for, the volume it is now)."""
        args = _volume_args(name, body, ("instance", "owner", "tenant"))
        disks = getattr(self.runtime, "disks", None)
        if disks is None:
            return
        try:
            await asyncio.to_thread(
                disks.adopt, name, args["instance"], args["owner"], args["tenant"]
            )
        except LaunchError as exc:
            raise conflict("volume_foreign", str(exc)) from exc
        except DiskError as exc:
            raise ApiError(404, "not_found", str(exc)) from exc

    async def delete_volume(self, name: str, owner: str, tenant: str) -> None:
        """Remove a volume's disk: refused (409 volume_busy) while an allocation here mounts it,
        or (409 volume_foreign) when the disk is not that volume's."""
        _volume_args(name, {"owner": owner, "tenant": tenant}, ("owner", "tenant"))
        held = [
            a.id
            for a in self.allocations.values()
            if any(v["name"] == name for v in a.spec.get("volumes") or [])
        ]
        if held:
            raise conflict("volume_busy", f"volume {name} is mounted by {', '.join(held)}")
        disks = getattr(self.runtime, "disks", None)
        if disks is None:
            return
        try:
            await asyncio.to_thread(disks.delete_owned, name, owner, tenant)
        except LaunchError as exc:
            raise conflict("volume_foreign", str(exc)) from exc
        except DiskError as exc:
            raise ApiError(500, "disk_failed", str(exc)) from exc
        log.info("volume %s of %s deleted", name, owner)

    def set_mode(self, index: int, mode: str) -> dict:
        """Repartition a GPU that holds no allocation; answer its inventory entry."""
        gpus = self.backend.gpus()
        if not 0 <= index < len(gpus):
            raise ApiError(404, "not_found", f"no GPU {index} on this host ({len(gpus)} GPUs)")
        if mode not in MODES:
            raise invalid(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        held = [a.id for a in self.allocations.values() if index in a.gpus]
        if held:
            raise conflict(
                "gpu_busy",
                f"GPU {index} holds {', '.join(held)}: its mode changes only when it holds nothing",
            )
        self.backend.set_mode(index, mode)
        self.gpu_modes[index] = mode
        self.store.save_gpu_modes(self.gpu_modes)
        log.info("GPU %d: %s mode", index, mode)
        return self.backend.gpus()[index]

    async def refresh(self) -> bool:
        """Read the runtime's view of the running workloads (a container engine is asked
        outside the event loop); False when it cannot be read this round."""
        try:
            await asyncio.to_thread(self.runtime.refresh, list(self.allocations.values()))
        except Exception as exc:
            if await self._engine_answers():  # an engine that is down is logged once
                log.warning(
                    "cannot read the workloads' state from the %s runtime: %s",
                    self.runtime.name,
                    exc,
                )
            return False
        return True

    async def _engine_answers(self) -> bool:
        check = getattr(self.runtime, "check_engine", None)
        return check is None or (await asyncio.to_thread(check))["state"] == "up"

    async def engine(self) -> dict | None:
        """The container engine's state, for the heartbeat (agent/runtimes/engine_state.py);
        None where the runtime has no engine. When it answers again, the workloads are read
        (and their exits acted on) before the console hears it is up: the console adopts back
        what still runs by what the agent lists then."""
        state = getattr(self.runtime, "engine_state", None)
        if state is None:
            return None
        was_down = state.down
        if await self._engine_answers() and was_down and await self.refresh():
            self._act(set(), set())
        return state.report()

    def _exited(self, alloc: Allocation, ended: Exit) -> None:
        """A workload ended by itself: exit 0 `exited`, anything else `failed` with why."""
        if ended.reason == "exit_status_unknown" or (ended.reason is None and ended.code == 0):
            state, reason = "exited", ended.reason or "exited"
        else:
            state, reason = "failed", ended.reason or f"exit code {ended.code}"
        self._ended(alloc, state, reason, ended.code, ended.at or now_iso())

    def poll(self) -> list[dict]:
        """Read a sample of every GPU, MIG device and running allocation, and act on what it
        shows: workloads that exited, GPUs that were lost, GPU memory caps exceeded. Each
        change is an event for the console."""
        samples = self.backend.sample(list(self.allocations.values()))
        over_cap = {s["allocation"] for s in samples if s["kind"] == "allocation" and _over_cap(s)}
        self._act(self.backend.lost_gpus(), over_cap)
        return samples

    async def watch_exits(self) -> None:
        """Act on a workload's exit as soon as the runtime tells of one, not at the next
        sampling round (the oci runtime follows the engine's events)."""
        exited = asyncio.Event()
        loop = asyncio.get_running_loop()
        self.runtime.watch(lambda: loop.call_soon_threadsafe(exited.set))
        while True:
            await exited.wait()
            exited.clear()
            if await self.refresh():
                self._act(set(), set())

    def _act(self, lost: set[int], over_cap: set[str]) -> None:
        changed = []
        for alloc in list(self.allocations.values()):
            if alloc.state != "running" or alloc.id in self._locks:
                continue
            ended = self.runtime.exit_status(alloc)
            if ended is not None:
                self._exited(alloc, ended)
            elif lost & set(alloc.gpus):
                self.runtime.kill(alloc)
                self._ended(alloc, "lost", "gpu_lost", finished_at=now_iso())
            elif alloc.id in over_cap:
                self.runtime.kill(alloc)
                self._ended(alloc, "failed", "gpu_memory_cap", finished_at=now_iso())
            else:
                continue
            changed.append(alloc)
        if changed:
            self._save()
            for alloc in changed:
                self._emit(alloc)


def _volume_args(name: str, body, fields: tuple[str, ...]) -> dict:
    if not VOLUME_PATTERN.fullmatch(name):
        raise invalid(f"a volume's name must match {VOLUME_PATTERN.pattern}, not {name!r}")
    if not isinstance(body, dict) or set(body) != set(fields):
        raise invalid(f"the body must be an object of exactly {', '.join(fields)}")
    for field in fields:
        if not isinstance(body[field], str) or not ID_PATTERN.fullmatch(body[field]):
            raise invalid(f"{field} must match [A-Za-z0-9_-]{{1,64}}, not {body[field]!r}")
    return body
