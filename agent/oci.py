"""The `oci` runtime: each allocation is a container run through the Docker Engine API, which
Docker Engine and Podman (`podman system service`) both serve.

A container is named `gpucloud-<instance>` and labelled with the instance, tenant and
allocation, so operators can find it and a restarted agent re-adopts it by label. The kernel
enforces the spec's vCPUs, RAM (no swap beyond it) and a pids limit; the workload runs with
no-new-privileges and without the capabilities a GPU workload never needs, and sees nothing of
the agent: only its image, its environment, its GPUs and its volume at /workspace. The volume
(`gpucloud-<instance>`) outlives the container: stop removes the container, terminate the
volume. A container's output is kept in the state directory when the container is removed, so
the instance's logs stay readable until the instance is deleted.

Every call here blocks: the host runs them in a worker thread.
"""

import asyncio
import contextlib
import functools
import logging
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import docker
import requests
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.types import DeviceRequest

from agent.allocations import Allocation
from agent.errors import ApiError
from agent.runtime import Exit, LaunchError, instance_log, tail_lines

log = logging.getLogger(__name__)

# Tried in order when no --engine-url is given: Podman's sockets first, then Docker's.
DEFAULT_ENGINE_URLS = (
    "unix:///run/podman/podman.sock",
    f"unix:///run/user/{os.getuid()}/podman/podman.sock",
    "unix:///var/run/docker.sock",
)
LABEL_INSTANCE = "gpucloud.instance"
LABEL_TENANT = "gpucloud.tenant"
LABEL_ALLOCATION = "gpucloud.allocation"
LABEL_SIZE = "gpucloud.size_gib"
WORKSPACE = "/workspace"
# Docker's default capabilities less those a GPU workload has no use for: raw sockets, device
# nodes, the audit log, chroot, file capabilities and changing its own process names.
DROPPED_CAPABILITIES = ["NET_RAW", "MKNOD", "AUDIT_WRITE", "SYS_CHROOT", "SETFCAP"]
DEFAULT_PIDS = 4096
ENGINE_TIMEOUT_SECONDS = 30
PULL_REPORT_SECONDS = 2.0
KMSG = Path("/dev/kmsg")
LIVE_STATES = ("running", "created", "configured", "initialized", "paused")
# a killed container that goes within this long was removed, not merely killed
REMOVAL_GRACE_SECONDS = 0.5
# a login shell: bash where the image has it, else sh
SHELL = ["/bin/sh", "-c", "if [ -x /bin/bash ]; then exec /bin/bash -l; else exec /bin/sh -l; fi"]
# what catatonit (Podman's init) and tini (Docker's) print when the command cannot be run
INIT_EXEC_FAILED = re.compile(r"failed to exec pid1|exec .* failed: (No such file|Permission)")


def running_engine() -> str | None:
    """The first of the usual engine sockets that is there (Podman's, then Docker's)."""
    for url in DEFAULT_ENGINE_URLS:
        if Path(url.removeprefix("unix://")).exists():
            return url
    return None


def container_name(alloc: Allocation) -> str:
    return f"gpucloud-{alloc.instance}"


def volume_name(instance: str) -> str:
    return f"gpucloud-{instance}"


def _iso(engine_time: str | None) -> str | None:
    """The engine's RFC 3339 time (nanoseconds) as ISO with milliseconds, UTC."""
    if not engine_time or engine_time.startswith("0001-"):
        return None
    head, _, rest = engine_time.rstrip("Z").partition(".")
    frac = "".join(ch for ch in rest if ch.isdigit())[:3].ljust(3, "0")
    try:
        moment = datetime.fromisoformat(head).replace(tzinfo=UTC)
    except ValueError:
        return None
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{frac}Z"


def _size(size: float) -> str:
    return f"{size / 1e9:.1f} GB" if size >= 1e8 else f"{size / 1e6:.1f} MB"


def killed_for_memory(container_id: str) -> bool:
    """Whether the kernel log tells of an OOM kill in this container's memory cgroup. Podman on
    cgroup v1 does not set OOMKilled, but the kernel names the cgroup it killed in."""
    try:
        fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    found = False
    try:
        while True:
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError:  # a record overwritten while reading: go on with the next one
                continue
            if not record:
                break
            if b"oom_memcg=" in record and container_id.encode() in record:
                found = True
    finally:
        os.close(fd)
    return found


def _engine_answers(method):
    """An engine that does not answer is the agent's 503 (the console retries), not a 500."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except (DockerException, requests.RequestException) as exc:
            if isinstance(exc, NotFound):
                raise
            raise ApiError(503, "engine_unavailable", f"{self.engine_url}: {exc}") from exc

    return call


class OciRuntime:
    name = "oci"

    def __init__(
        self,
        engine_url: str | None,
        log_dir: Path,
        stop_grace: float,
        *,
        cdi: bool = False,
        mps_dir: Path | None = None,
    ):
        """`cdi`: hand GPUs to containers as CDI devices (hosts with real GPUs); without it the
        environment only says which devices a real host would pass. `mps_dir`: where the CUDA
        MPS daemons of shared GPUs keep their pipes (real GPUs only)."""
        self.engine_url = engine_url or self._find_engine()
        self.client = docker.DockerClient(base_url=self.engine_url, timeout=ENGINE_TIMEOUT_SECONDS)
        version = self.client.version()
        components = [c.get("Name", "") for c in version.get("Components", [])]
        self.engine = "podman" if any("Podman" in c for c in components) else "docker"
        self.engine_version = version.get("Version", "")
        self.log_dir = log_dir
        self.stop_grace = stop_grace
        self.cdi = cdi
        self.mps = MpsDaemons(mps_dir) if mps_dir else None
        self._exits: dict[str, Exit] = {}  # allocation id -> how its workload ended
        self._stopping: set[str] = set()
        self._images: set[str] = set()  # references seen here: a launch of one looks no more
        self._lock = threading.Lock()
        log.info("oci runtime: %s %s at %s", self.engine, self.engine_version, self.engine_url)

    @staticmethod
    def _find_engine() -> str:
        url = running_engine()
        if url:
            return url
        raise DockerException(
            "no container engine socket found (tried "
            + ", ".join(DEFAULT_ENGINE_URLS)
            + "): start `podman system service` or Docker, or give --engine-url"
        )

    # --- images ---------------------------------------------------------------------------

    def _ensure_image(self, reference: str, progress) -> None:
        try:
            self.client.images.get(reference)
            return
        except ImageNotFound:
            pass
        except APIError as exc:
            raise LaunchError(f"engine_unavailable: {exc.explanation or exc}") from exc
        repository, tag = _split_reference(reference)
        progress(f"pulling {reference}")
        started = time.monotonic()
        layers: dict[str, tuple[float, float]] = {}
        reported = 0.0
        try:
            for line in self.client.api.pull(repository, tag=tag, stream=True, decode=True):
                if line.get("error"):
                    raise LaunchError(f"image_pull_failed: {reference}: {line['error']}")
                detail = line.get("progressDetail") or {}
                if line.get("id") and detail.get("total"):
                    layers[line["id"]] = (detail.get("current", 0), detail["total"])
                if layers and time.monotonic() - reported >= PULL_REPORT_SECONDS:
                    done = sum(c for c, _ in layers.values())
                    total = sum(t for _, t in layers.values())
                    progress(f"pulling {reference}: {_size(done)} of {_size(total)}")
                    reported = time.monotonic()
        except NotFound as exc:
            raise LaunchError(f"image_not_found: {reference}: {exc.explanation or exc}") from exc
        except APIError as exc:
            raise LaunchError(f"image_pull_failed: {reference}: {exc.explanation or exc}") from exc
        try:
            self.client.images.get(reference)
        except ImageNotFound as exc:
            raise LaunchError(f"image_not_found: {reference} (the pull brought nothing)") from exc
        progress(f"pulled {reference} in {time.monotonic() - started:.0f} s")

    # --- containers -----------------------------------------------------------------------

    def _find(self, alloc: Allocation):
        """The allocation's container (inspected), or None."""
        listed = self.client.containers.list(
            all=True, sparse=True, filters={"label": f"{LABEL_ALLOCATION}={alloc.id}"}
        )
        for container in listed:
            try:
                container.reload()
            except NotFound:  # removed between the listing and now
                continue
            return container
        return None

    def _devices(self, alloc: Allocation) -> list[str]:
        """The CDI names of the allocation's GPUs: the MIG device, or the whole GPUs."""
        uuids = [alloc.mig_uuid] if alloc.mig_uuid else alloc.gpu_uuids
        return [f"nvidia.com/gpu={uuid}" for uuid in uuids]

    def _gpu_options(self, alloc: Allocation, env: dict[str, str]) -> dict:
        devices = self._devices(alloc)
        if not self.cdi:
            env["GPUCLOUD_CDI_DEVICES"] = ",".join(devices)
            return {}
        options: dict = {}
        if self.engine == "podman":
            options["devices"] = devices
        else:
            options["device_requests"] = [DeviceRequest(driver="cdi", device_ids=devices)]
        if alloc.mode == "shared" and self.mps is not None:
            pipe = self.mps.ensure(alloc.gpu_uuids[0])
            env["CUDA_MPS_PIPE_DIRECTORY"] = str(pipe)
            options["volumes_extra"] = {str(pipe): {"bind": str(pipe), "mode": "rw"}}
        return options

    def launch(self, alloc: Allocation, command: list[str] | None, env: dict[str, str], progress):
        """Pull the image if needed, create and start the container; answer (pid, None).
        Raises LaunchError with the reason when it cannot run."""
        try:
            return self._launch(alloc, command, env, progress)
        except (DockerException, requests.RequestException) as exc:
            raise LaunchError(f"engine_unavailable: {self.engine_url}: {exc}") from exc

    def _launch(self, alloc: Allocation, command: list[str] | None, env: dict[str, str], progress):
        spec = alloc.spec
        reference = spec.get("image")
        if not reference:
            raise LaunchError("launch_failed: the allocation names no image")
        if reference not in self._images:
            self._ensure_image(reference, progress)
            self._images.add(reference)
        labels = spec["labels"]
        instance = alloc.instance
        volume = (spec.get("volume") or {}).get("name") or volume_name(instance)
        resources = spec.get("resources") or {}
        env = dict(env)
        gpu = self._gpu_options(alloc, env)
        volumes = {volume: {"bind": WORKSPACE, "mode": "rw"}, **gpu.pop("volumes_extra", {})}
        options: dict = {
            "name": container_name(alloc),
            "command": command,
            "environment": env,
            "labels": {
                LABEL_INSTANCE: instance,
                LABEL_TENANT: labels.get("tenant", ""),
                LABEL_ALLOCATION: alloc.id,
            },
            "volumes": volumes,
            "working_dir": WORKSPACE,
            "detach": True,
            "init": True,  # a real init: signals reach the workload, zombies are reaped
            "security_opt": ["no-new-privileges"],
            "cap_drop": DROPPED_CAPABILITIES,
            "pids_limit": resources.get("pids") or DEFAULT_PIDS,
            "ulimits": [],
            **gpu,
        }
        if resources.get("vcpus"):
            options["nano_cpus"] = int(resources["vcpus"] * 1_000_000_000)
        if resources.get("memory_mib"):
            limit = f"{resources['memory_mib']}m"
            options["mem_limit"] = options["memswap_limit"] = limit
        try:
            self._ensure_volume(volume, instance, (spec.get("volume") or {}).get("size_gib"))
            container = self._create(reference, options, alloc.id, progress)
        except ImageNotFound as exc:
            raise LaunchError(f"image_not_found: {reference}") from exc
        except APIError as exc:
            raise LaunchError(f"launch_failed: {exc.explanation or exc}") from exc
        try:
            container.start()
        except APIError as exc:
            self._keep_logs(container, instance)
            with contextlib.suppress(APIError):
                container.remove(force=True)
            raise LaunchError(_start_failure(exc)) from exc
        container.reload()
        with self._lock:
            self._exits.pop(alloc.id, None)
        alloc.container = container.name
        return container.attrs["State"].get("Pid") or None, None

    def _create(self, reference: str, options: dict, alloc_id: str, progress):
        """Create the container, asking the engine only that on the usual path (every call
        is the engine's CPU, which a burst of launches shares): an image removed since it
        was seen here is pulled again; a container of the same name left by an earlier
        allocation of the instance is removed (its output kept) when the engine refuses the
        name."""
        try:
            return self.client.containers.create(reference, **options)
        except ImageNotFound:
            self._images.discard(reference)
            self._ensure_image(reference, progress)
            self._images.add(reference)
        except APIError as exc:
            if not _name_in_use(exc):
                raise
            self._remove_stale(options["name"], alloc_id)
        return self.client.containers.create(reference, **options)

    def _ensure_volume(self, name: str, instance: str, size_gib: int | None) -> None:
        """Create the volume; the engine answers one that is there already as it is."""
        labels = {LABEL_INSTANCE: instance}
        if size_gib:
            labels[LABEL_SIZE] = str(size_gib)
        self.client.volumes.create(name, labels=labels)

    def _remove_stale(self, name: str, alloc_id: str) -> None:
        """A container of the same name left by an earlier allocation of the instance (the
        agent died between its stop and its removal): keep its output, then remove it."""
        try:
            stale = self.client.containers.get(name)
        except NotFound:
            return
        if stale.labels.get(LABEL_ALLOCATION) != alloc_id:
            self._keep_logs(stale, stale.labels.get(LABEL_INSTANCE, ""))
        stale.remove(force=True)

    def adopt(self, alloc: Allocation) -> bool:
        """Whether the allocation's container is still there (running or not: an exit while
        the agent was away is reported by the next poll, with its code)."""
        try:
            container = self._find(alloc)
        except DockerException as exc:
            log.warning("cannot look for the container of %s: %s", alloc.id, exc)
            return False
        if container is None:
            return False
        alloc.container = container.name
        return True

    def refresh(self, allocations: list[Allocation]) -> None:
        """Find out which running allocations' workloads ended, and how (one listing, plus a
        look at each that ended). Exceptions (an engine that is down) propagate."""
        running = {a.id: a for a in allocations if a.state == "running"}
        if not running:
            return
        listed = self.client.containers.list(
            all=True, sparse=True, filters={"label": LABEL_ALLOCATION}
        )
        exits: dict[str, Exit] = {}
        present = set()
        for container in listed:
            alloc = running.get((container.attrs.get("Labels") or {}).get(LABEL_ALLOCATION))
            if alloc is None:
                continue
            present.add(alloc.id)
            if container.attrs.get("State") in LIVE_STATES:
                continue
            exits[alloc.id] = self._how_it_ended(alloc, container)
        for alloc_id in running.keys() - present:
            exits[alloc_id] = Exit(None, "container_lost", None)
        with self._lock:
            self._exits.update(exits)

    def _how_it_ended(self, alloc: Allocation, container) -> Exit:
        """How the workload of a container that no longer runs ended."""
        try:
            container.reload()
        except NotFound:
            return Exit(None, "container_lost", None)
        state = container.attrs["State"]
        code, at = state.get("ExitCode"), _iso(state.get("FinishedAt"))
        if state.get("OOMKilled") or (code == 137 and killed_for_memory(container.id)):
            return Exit(code, "oom_killed", at)
        if code and self._init_could_not_exec(container):
            command = " ".join(alloc.spec["command"] or ["the image's command"])
            return Exit(code, f"command_not_found: {command}: not in the image", at)
        if code == 137:  # killed: by someone removing it behind our back?
            time.sleep(REMOVAL_GRACE_SECONDS)
            try:
                container.reload()
            except NotFound:
                return Exit(code, "container_lost", at)
        return Exit(code, None, at)

    def watch(self, on_exit) -> None:
        """Call `on_exit()` (from a thread of its own) whenever one of our containers dies,
        following the engine's event stream; reconnect when the engine goes away."""

        def follow() -> None:
            while True:
                try:
                    for event in self.client.events(decode=True):
                        attributes = (event.get("Actor") or {}).get("Attributes") or {}
                        if event.get("Action") == "die" and LABEL_ALLOCATION in attributes:
                            on_exit()
                except Exception as exc:  # the engine restarted or went away: follow again
                    log.warning("engine events: %s; following again in 1 s", exc)
                time.sleep(1)

        threading.Thread(target=follow, name="engine-events", daemon=True).start()

    def exit_status(self, alloc: Allocation) -> Exit | None:
        """How the workload ended, or None while it runs (as last refreshed)."""
        with self._lock:
            if alloc.id in self._stopping:
                return None
            return self._exits.get(alloc.id)

    def _init_could_not_exec(self, container) -> bool:
        """Whether the container's init (catatonit, tini) said it could not start the
        command: the workload never ran."""
        with contextlib.suppress(DockerException):
            last = container.logs(stdout=True, stderr=True, tail=3).decode(errors="replace")
            return bool(INIT_EXEC_FAILED.search(last))
        return False

    async def stop(self, alloc: Allocation) -> int | None:
        """SIGTERM, then SIGKILL after the grace; answer the exit code."""
        return await asyncio.to_thread(self._stop, alloc)

    def _stop(self, alloc: Allocation) -> int | None:
        with self._lock:
            self._stopping.add(alloc.id)
        try:
            container = self._find(alloc)
            if container is None:
                return None
            container.stop(timeout=max(1, round(self.stop_grace)))
            container.reload()
            return container.attrs["State"].get("ExitCode")
        finally:
            with self._lock:
                self._stopping.discard(alloc.id)
                self._exits.pop(alloc.id, None)

    def kill(self, alloc: Allocation) -> None:
        with contextlib.suppress(DockerException):
            container = self._find(alloc)
            if container is not None:
                container.kill()

    @_engine_answers
    def remove(self, alloc: Allocation) -> None:
        """The allocation is deleted: keep the container's output, remove the container
        (the volume stays)."""
        container = self._find(alloc)
        with self._lock:
            self._exits.pop(alloc.id, None)
        if container is None:
            return
        self._keep_logs(container, container.labels.get(LABEL_INSTANCE, ""))
        with contextlib.suppress(NotFound):
            container.remove(force=True)

    # --- exec: shells and commands inside a running container ------------------------------

    @_engine_answers
    def running_container(self, alloc: Allocation):
        """The allocation's container while it runs, else None."""
        container = self._find(alloc)
        if container is None or container.attrs.get("State", {}).get("Status") != "running":
            return None
        return container

    def exec_open(
        self, container, command: list[str] | None, tty: bool, env: dict[str, str]
    ) -> tuple[str, socket.socket]:
        """Start `command` (None: a login shell, bash where the image has it) in the
        container; answer the exec id and its raw, bidirectional stream (with tty the
        terminal's bytes as they are; without, Docker's multiplexed frames)."""
        exec_id = self.client.api.exec_create(
            container.id,
            command or SHELL,
            tty=tty,
            stdin=True,
            environment=env,
            workdir=WORKSPACE,
        )["Id"]
        stream = self.client.api.exec_start(exec_id, tty=tty, socket=True)
        return exec_id, stream._sock

    def exec_resize(self, exec_id: str, cols: int, rows: int) -> None:
        with contextlib.suppress(APIError):
            self.client.api.exec_resize(exec_id, height=rows, width=cols)

    def exec_exit_code(self, exec_id: str) -> int | None:
        """The exec's exit code once it has ended (None while it runs, or unknown)."""
        for _ in range(50):
            state = self.client.api.exec_inspect(exec_id)
            if not state.get("Running"):
                return state.get("ExitCode")
            time.sleep(0.02)
        return None

    def volume_path(self, instance: str) -> Path | None:
        """Where the instance's volume lies on this host (None: no volume here)."""
        try:
            return Path(self.client.volumes.get(volume_name(instance)).attrs["Mountpoint"])
        except NotFound:
            return None

    def container_address(self, container) -> str | None:
        """The container's address on the engine's network (its ports are reached there)."""
        settings = container.attrs.get("NetworkSettings") or {}
        if settings.get("IPAddress"):
            return settings["IPAddress"]
        for network in (settings.get("Networks") or {}).values():
            if network.get("IPAddress"):
                return network["IPAddress"]
        return None

    # --- logs and volumes -----------------------------------------------------------------

    def _keep_logs(self, container, instance: str) -> None:
        if not instance:
            return
        try:
            output = container.logs(stdout=True, stderr=True)
        except DockerException as exc:
            log.warning("could not keep the output of %s: %s", container.name, exc)
            return
        if output:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            with open(instance_log(self.log_dir, instance), "ab") as kept:
                kept.write(output if output.endswith(b"\n") else output + b"\n")

    @_engine_answers
    def logs(self, instance: str, allocations: list[Allocation], tail: int) -> list[str]:
        """The instance's output on this host, most recent last: what earlier containers
        printed, then the current container's."""
        lines = tail_lines(instance_log(self.log_dir, instance), tail)
        for alloc in allocations:
            container = self._find(alloc)
            with contextlib.suppress(NotFound):  # removed meanwhile: its output is kept above
                if container is not None:
                    text = container.logs(stdout=True, stderr=True, tail=tail)
                    lines.extend(text.decode(errors="replace").splitlines())
        return list(lines)

    @_engine_answers
    def delete_instance(self, instance: str) -> None:
        """Remove the instance's volume and kept output from this host."""
        with contextlib.suppress(NotFound):
            self.client.volumes.get(volume_name(instance)).remove(force=True)
        instance_log(self.log_dir, instance).unlink(missing_ok=True)


def _split_reference(reference: str) -> tuple[str, str]:
    """`repo[:tag]` or `repo@digest` → (repository, tag or digest)."""
    if "@" in reference:
        repository, _, digest = reference.partition("@")
        return repository, digest
    last = reference.rsplit("/", 1)[-1]
    if ":" in last:
        repository, _, tag = reference.rpartition(":")
        return repository, tag
    return reference, "latest"


def _name_in_use(exc: APIError) -> bool:
    """Whether the engine refused a container's name as taken (Docker: 409; Podman: 500)."""
    return exc.status_code == 409 or "already in use" in str(exc.explanation or "")


def _start_failure(exc: APIError) -> str:
    text = str(exc.explanation or exc)
    if "executable file not found" in text or "no such file or directory" in text:
        return f"command_not_found: {text}"
    return f"launch_failed: {text}"


class MpsDaemons:
    """One CUDA MPS control daemon per shared GPU (real GPUs only): its pipe directory is
    mounted into the containers of that GPU's fractions."""

    def __init__(self, root: Path):
        self.root = root
        self._started: set[str] = set()

    def ensure(self, gpu_uuid: str) -> Path:
        pipe = self.root / gpu_uuid / "pipe"
        if gpu_uuid in self._started and (pipe / "control").exists():
            return pipe
        control = shutil.which("nvidia-cuda-mps-control")
        if control is None:
            raise LaunchError("launch_failed: nvidia-cuda-mps-control is not installed")
        pipe.mkdir(parents=True, exist_ok=True)
        logs = self.root / gpu_uuid / "log"
        logs.mkdir(parents=True, exist_ok=True)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "CUDA_VISIBLE_DEVICES": gpu_uuid,
            "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(logs),
        }
        result = subprocess.run([control, "-d"], env=env, capture_output=True, text=True)
        if result.returncode != 0:
            raise LaunchError(f"launch_failed: MPS daemon for {gpu_uuid}: {result.stderr.strip()}")
        self._started.add(gpu_uuid)
        log.info("MPS control daemon for GPU %s, pipes in %s", gpu_uuid, pipe)
        return pipe
