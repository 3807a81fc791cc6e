"""The `oci` runtime: each allocation is a container run through the Docker Engine API, which
Docker Engine and Podman (`podman system service`) both serve.

A container is named `gpucloud-<instance>` and labelled with the instance, tenant and
allocation, so operators can find it and a restarted agent re-adopts it by label. Each runs in
a user namespace (Podman: one of its own, `userns=auto`, 65536 ids from the `containers` range
of /etc/subuid; Docker: the daemon's `userns-remap`, one range for all its containers, whose
root is given each disk's root), so its root is an unprivileged user on the host. The kernel
enforces the spec's vCPUs, RAM (no swap beyond it) and a pids limit (at most the host's share,
see `pids_ceiling`); the workload runs with no-new-privileges and without the capabilities a
GPU workload never needs, and sees nothing of the agent: only its image, its environment, its
GPUs and its disk at /workspace (agent/volumes.py), which outlives the container: stop removes
the container, terminate the disk. The engine caps each container's log (LOG_CONFIG); the
agent reads its end (Podman's from the log file itself, Docker's through its API, which reads
from the end too), and keeps the last of it in the state directory when the container is
removed, so the instance's logs stay readable until the instance is deleted.

Every call here blocks: the host runs them in a worker thread.
"""

import asyncio
import contextlib
import functools
import io
import logging
import os
import re
import socket
import tarfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import docker
import requests
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.models.containers import _create_container_args
from docker.types import DeviceRequest, LogConfig

from agent.allocations import Allocation
from agent.cpu import cgroup_seconds
from agent.errors import ApiError
from agent.image_store import DISK_HIGH_PERCENT, DISK_LOW_PERCENT, ImageStore
from agent.mps import CLIENT_PIPE, MpsDaemons
from agent.networks import TenantNetworks
from agent.runtimes import Exit, LaunchError
from agent.runtimes.engine_state import EngineState
from agent.runtimes.output import (
    KEPT_LOG_BYTES,
    file_end,
    forget_output,
    instance_log,
    keep_output,
    tail_lines,
)
from agent.sessions import GATE
from agent.volumes import DiskError, Disks

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
WORKSPACE = "/workspace"
# Podman: a user namespace of its own per container, from the `containers` subordinate ids
PODMAN_USERNS = "auto:size=65536"
GPU_PATHS = {
    "cdi": "as CDI devices (nvidia.com/gpu=<UUID>)",
    "nvidia": "as device requests for the NVIDIA Container Toolkit's runtime (Docker without CDI)",
}
# Docker's data root under userns-remap ends in the remapped root's ids: `…/100000.100000`
REMAPPED_ROOT = re.compile(r"/([0-9]+)\.([0-9]+)\Z")
SUBID_FILES = (Path("/etc/subuid"), Path("/etc/subgid"))
# each container's log: Podman truncates it at the size (it keeps no rotated files), Docker
# rotates it into a second file
LOG_CONFIG = LogConfig(type="json-file", config={"max-size": "8m", "max-file": "2"})
# Docker's default capabilities less those a GPU workload has no use for: raw sockets, device
# nodes, the audit log, chroot, file capabilities and changing its own process names.
DROPPED_CAPABILITIES = ["NET_RAW", "MKNOD", "AUDIT_WRITE", "SYS_CHROOT", "SETFCAP"]
DEFAULT_PIDS = 4096
CPU_PERIOD = 100_000  # µs: the CFS period Docker's NanoCpus use too
LIBPOD_API = "v4.0.0"  # Podman's own API, for what its Docker-compatible one lacks
# the containers may hold half the host's pids between them, each at least the floor
PIDS_HOST_SHARE = 0.5
PIDS_FLOOR = 256
# what one GPU may hold: 7 MIG instances, or 8 fractions of the catalog's smallest (1/8)
CONTAINERS_PER_GPU = 8
ENGINE_TIMEOUT_SECONDS = 30
# how long a ping may take before the engine counts as not answering (EngineState)
PING_TIMEOUT_SECONDS = 2
KMSG = Path("/dev/kmsg")
KERNEL_PIDS = ("pid_max", "threads-max")
LIVE_STATES = ("running", "created", "configured", "initialized", "paused")
# a killed container that goes within this long was removed, not merely killed
REMOVAL_GRACE_SECONDS = 0.5
# a login shell: bash where the image has it, else sh
SHELL = ["/bin/sh", "-c", "if [ -x /bin/bash ]; then exec /bin/bash -l; else exec /bin/sh -l; fi"]
# what catatonit (Podman's init) and tini (Docker's) print when the command cannot be run
DEFAULT_LAYER_GIB = 20
# a throwaway image and container: whether the engine bounds a container's writable layer
LAYER_PROBE_IMAGE = "localhost/gpucloud/layer-probe:latest"
LAYER_UNBOUNDED = "the container's writable layer is unbounded (--unbounded-layers)"
INIT_EXEC_FAILED = re.compile(r"failed to exec pid1|exec .* failed: (No such file|Permission)")


def cpu_limit(vcpus: float, machine_cpus: int) -> tuple[float, str]:
    """The CPU limit a container of `vcpus` is given on a machine of `machine_cpus`, and what
    to say when it is less (an operator who offers more vCPUs than the machine has, as the
    simulated GPUs of a demo do): never more than the machine has."""
    if vcpus <= machine_cpus:
        return vcpus, ""
    return machine_cpus, (
        f"its {vcpus:g} vCPUs are capped at this machine's {machine_cpus} CPUs: the engine "
        "cannot give a container more"
    )


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


def pids_ceiling(containers: int) -> int:
    """The most pids (threads included) one container may have: half of the host's (pid_max,
    or threads-max where lower) shared by the containers the agent may hold, at least
    PIDS_FLOOR."""
    host = min(int(Path(f"/proc/sys/kernel/{name}").read_text()) for name in KERNEL_PIDS)
    return max(PIDS_FLOOR, int(host * PIDS_HOST_SHARE) // max(1, containers))


def gpu_path(engine: str, info: dict) -> str:
    """How GPUs reach the engine's containers: "cdi" (CDI device names: Podman, and Docker 27+
    where its CDI feature is on, which its info tells by the spec folders it reads) or
    "nvidia" (Docker's device requests for the NVIDIA Container Toolkit's runtime hook)."""
    if engine == "podman" or info.get("CDISpecDirs"):
        return "cdi"
    return "nvidia"


def describe_engine(engine_url: str | None) -> dict:
    """What the oci runtime would find at `engine_url` (None: the usual sockets), read-only, for
    `gpucloud-agent probe`: the engine (kind, version), how GPUs would reach its containers
    (`gpu_path`, None when no engine answers), and in words whether its containers get user
    namespaces of their own, whether their writable layers are bounded and what a restart of
    the engine would do to them; `line` says it in one line, `warnings` what the operator
    should change."""
    url = engine_url or running_engine()
    if url is None:
        line = f"container engine: none found ({', '.join(DEFAULT_ENGINE_URLS)})"
        return {"url": None, "line": line, "gpu_path": None, "warnings": []}
    try:
        client = docker.DockerClient(base_url=url, timeout=ENGINE_TIMEOUT_SECONDS)
        try:
            version, info = client.version(), client.info()
        finally:
            client.close()
    except DockerException as exc:
        line = f"container engine at {url} does not answer: {exc}"
        return {"url": url, "line": line, "gpu_path": None, "warnings": []}
    components = [c.get("Name", "") for c in version.get("Components", [])]
    engine = "podman" if any("Podman" in c for c in components) else "docker"
    path = gpu_path(engine, info)
    userns, userns_ok = user_namespaces(engine, info)
    restart, restart_ok = engine_restart(engine, info)
    layers = layers_bounded(info)
    warnings = [] if userns_ok else [f"user namespaces: {userns}"]
    warnings += [] if restart_ok else [f"engine restart: {restart}"]
    if layers.startswith("not bounded"):
        warnings.append(
            f"containers' writable layers {layers}: the agent refuses to start unless given "
            "--unbounded-layers (keep the engine's storage on xfs with pquota, or use the btrfs "
            "driver: README, host section)"
        )
    return {
        "url": url,
        "kind": engine,
        "version": version.get("Version", ""),
        "gpu_path": path,
        "user_namespaces": userns,
        "writable_layers": layers,
        "restart": restart,
        "line": f"container engine: {engine} {version.get('Version', '')} at {url}; GPUs "
        f"{GPU_PATHS[path]}",
        "warnings": warnings,
    }


def user_namespaces(engine: str, info: dict) -> tuple[str, bool]:
    """Whether the engine gives containers user namespaces of their own (the agent refuses an
    engine that does not), in words, and whether that is so."""
    if engine == "podman":
        if _subid_range("containers"):
            return (
                "each container its own (userns auto, the `containers` range of /etc/subuid)",
                True,
            )
        return (
            "no `containers` range in /etc/subuid and /etc/subgid: the agent refuses to start "
            "(add `containers:2147483647:2147483648` to both)",
            False,
        )
    if any("name=userns" in option for option in info.get("SecurityOptions") or []):
        return "remapped (dockerd --userns-remap)", True
    return (
        "NOT remapped: containers would run as the host's root, and the agent refuses to start "
        '(daemon.json: "userns-remap": "default")',
        False,
    )


def engine_restart(engine: str, info: dict) -> tuple[str, bool]:
    """What a restart (or upgrade) of the engine would do to the running containers, in words,
    and whether they survive it."""
    if engine == "podman":
        return (
            "containers survive: conmon runs each container, not the API service, so a restart "
            "of `podman system service` (podman.socket) keeps them and their processes",
            True,
        )
    if info.get("LiveRestoreEnabled"):
        return (
            "containers survive (live-restore on): dockerd can restart or be upgraded and the "
            "same containers and processes keep running; the agent follows them again",
            True,
        )
    return (
        "every container is stopped (live-restore off): a restart of dockerd kills every "
        'tenant\'s processes; set "live-restore": true in /etc/docker/daemon.json and '
        "`systemctl reload docker`",
        False,
    )


def layers_bounded(info: dict) -> str:
    """Whether the engine's storage driver can bound a container's writable layer, from its
    info alone (read-only, for the probe): btrfs can (quota groups); overlay only on xfs
    mounted with pquota, which info does not tell."""
    driver = info.get("Driver", "")
    backing = dict(info.get("DriverStatus") or []).get("Backing Filesystem", "")
    if driver == "btrfs":
        return "bounded (btrfs driver)"
    if driver.startswith("overlay") and backing == "xfs":
        return "bounded only if its xfs is mounted with pquota (the agent tries at start)"
    return f"not bounded ({driver or 'unknown'} driver on {backing or 'unknown'})"


def decide_layers(bounded: bool, unbounded_ok: bool, why: str) -> None:
    """Refuse (DockerException) an engine that cannot bound a container's writable layer,
    unless the operator allowed it (--unbounded-layers: then it is logged as a warning)."""
    if bounded:
        return
    if not unbounded_ok:
        raise DockerException(
            f"the engine cannot bound a container's writable layer ({why}): keep its storage "
            "on xfs mounted with pquota (overlay) or on btrfs (btrfs driver), or start the "
            "agent with --unbounded-layers"
        )
    log.warning("containers' writable layers are NOT bounded (--unbounded-layers): %s", why)


def remapped_root(info: dict) -> tuple[int, int] | None:
    """The host uid and gid of the containers' root under Docker's userns-remap (None: not
    remapped), from the daemon's data root."""
    found = REMAPPED_ROOT.search(info.get("DockerRootDir") or "")
    return (int(found[1]), int(found[2])) if found else None


def _subid_range(owner: str) -> bool:
    """Whether /etc/subuid and /etc/subgid both give `owner` a range."""
    for path in SUBID_FILES:
        with contextlib.suppress(FileNotFoundError):
            if any(line.split(":")[0] == owner for line in path.read_text().splitlines()):
                continue
        return False
    return True


def _podman_log_lines(chunk: bytes) -> list[str]:
    """The lines of Podman's k8s-file log records (`<time> <stream> <P|F> <text>`), the
    partial records (P) of a long line joined."""
    lines, partial = [], []
    for record in chunk.split(b"\n"):
        fields = record.split(b" ", 3)
        if len(fields) < 4:
            continue
        partial.append(fields[3])
        if fields[2] != b"P":
            lines.append(b"".join(partial).decode(errors="replace"))
            partial = []
    if partial:
        lines.append(b"".join(partial).decode(errors="replace"))
    return lines


def podman_log_tail(path: Path, tail: int | None) -> list[str]:
    """The last `tail` lines (None: all there is, up to KEPT_LOG_BYTES) of a Podman log file,
    read from its end: Podman's own API reads a long line whole into its memory."""
    chunk = file_end(
        path,
        KEPT_LOG_BYTES,
        lambda chunk: tail is not None and len(_podman_log_lines(chunk)) > tail,
    )
    lines = _podman_log_lines(chunk)
    return lines[-tail:] if tail else lines


def _iso(engine_time: str | None) -> str | None:
    """The engine's RFC 3339 time (nanoseconds) as ISO with milliseconds, UTC."""
    if not engine_time or engine_time.startswith("0001-"):
        return None
    head, _, rest = engine_time.rstrip("Z").partition(".")
    frac = re.sub(r"[^0-9]", "", rest)[:3].ljust(3, "0")
    try:
        moment = datetime.fromisoformat(head).replace(tzinfo=UTC)
    except ValueError:
        return None
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{frac}Z"


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
        install: str,
        egress: str = "all",
        cdi: bool = False,
        mps_dir: Path | None = None,
        gpus: int = 1,
        unbounded_layers: bool = False,
        images_disk: tuple[int, int] = (DISK_HIGH_PERCENT, DISK_LOW_PERCENT),
    ):
        """`cdi`: hand GPUs to containers (hosts with real GPUs) as CDI devices, or on a Docker
        without CDI as device requests for the NVIDIA runtime (`gpu_path`); without it the
        environment only says which devices a real host would pass. `mps_dir`: where the CUDA
        MPS daemons of shared GPUs keep their pipes (real GPUs only). `install`, `egress`: the
        tenant networks' names and what their containers may reach (agent/networks.py).
        `gpus`: how many the host has (the pids ceiling shares the host's among the containers
        they may hold). `images_disk`: how full the engine's disk may get before images go
        to make room, and until when (agent/image_store.py). Disks are made beside `log_dir`,
        in `disks/`. Refuses
        (DockerException) an engine that would run containers in the host's user namespace,
        and one that cannot bound a container's writable layer unless `unbounded_layers`."""
        self.engine_url = engine_url or self._find_engine()
        self.client = docker.DockerClient(base_url=self.engine_url, timeout=ENGINE_TIMEOUT_SECONDS)
        version = self.client.version()
        components = [c.get("Name", "") for c in version.get("Components", [])]
        self.engine = "podman" if any("Podman" in c for c in components) else "docker"
        self.engine_version = version.get("Version", "")
        self.engine_state = EngineState(self.engine_url)
        self._pinger = docker.APIClient(
            base_url=self.engine_url,
            version=self.client.api.api_version,
            timeout=PING_TIMEOUT_SECONDS,
        )
        self._ping_lock = threading.Lock()  # the heartbeat and the events' thread both ping
        info = self.client.info()
        self._check_userns(info)
        # Docker refuses a CPU limit above the machine's CPUs (Podman takes it): what a
        # container is given is capped at them, on both engines (cpu_limit).
        self.machine_cpus = int(info.get("NCPU") or os.cpu_count() or 1)
        self.gpu_path = gpu_path(self.engine, info)
        # Docker has no `U` bind option: the disk's root is given to the remapped root
        self.remapped_root = remapped_root(info) if self.engine == "docker" else None
        self.pids_ceiling = pids_ceiling(CONTAINERS_PER_GPU * gpus)
        why = self._probe_layers()
        self.layers_bounded = why is None
        decide_layers(self.layers_bounded, unbounded_layers, why or "")
        self.disks = Disks(log_dir.with_name("disks"))
        self.log_dir = log_dir
        self.stop_grace = stop_grace
        self.cdi = cdi
        self.mps = MpsDaemons(mps_dir) if mps_dir else None
        self.networks = TenantNetworks(self.client, install, egress, podman=self.engine == "podman")
        self._exits: dict[str, Exit] = {}  # allocation id -> how its workload ended
        self._stopping: set[str] = set()
        self._images: set[str] = set()  # references seen here: a launch of one looks no more
        self.images = ImageStore(self.client, log_dir.with_name("images.json"), images_disk)
        self._lock = threading.Lock()
        self._starting = threading.Lock()  # a container's disks checked free, then started
        log.info(
            "oci runtime: %s %s at %s; GPUs %s; at most %d pids a container; writable layers %s",
            self.engine,
            self.engine_version,
            self.engine_url,
            GPU_PATHS[self.gpu_path] if cdi else "not passed (simulated)",
            self.pids_ceiling,
            "bounded" if self.layers_bounded else "NOT bounded",
        )

    def _probe_layers(self) -> str | None:
        """Whether the engine bounds a container's writable layer: a throwaway container
        (from an empty image of our own) created with the storage option `size`; None when
        it can, else why not."""
        try:
            self.client.images.get(LAYER_PROBE_IMAGE)
        except ImageNotFound:
            empty = io.BytesIO()
            tarfile.open(fileobj=empty, mode="w").close()
            repository, _, tag = LAYER_PROBE_IMAGE.rpartition(":")
            self.client.api.import_image_from_data(empty.getvalue(), repository=repository, tag=tag)
        try:
            container = self.client.containers.create(
                LAYER_PROBE_IMAGE, ["true"], storage_opt={"size": "1G"}
            )
        except APIError as exc:
            return str(exc.explanation or exc)
        with contextlib.suppress(APIError):
            container.remove(force=True)
        return None

    def _check_userns(self, info: dict) -> None:
        if self.engine == "podman" and not _subid_range("containers"):
            raise DockerException(
                "Podman gives each container a user namespace from the `containers` range of "
                "/etc/subuid and /etc/subgid, and there is none: add "
                "`containers:2147483647:2147483648` to both"
            )
        if self.engine == "docker":
            options = info.get("SecurityOptions") or []
            if not any("name=userns" in option for option in options):
                raise DockerException(
                    "Docker runs containers in the host's user namespace: start dockerd with "
                    "--userns-remap=default"
                )

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

    def _ensure_image(self, reference: str, progress, auth: dict | None = None) -> None:
        """Pull the image unless the engine has it (agent/image_store.py: through the
        region's mirror first), with the tenant's registry credential `auth` if any."""
        self.images.ensure(reference, progress, auth)
        self.images.launching(reference)

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

    def _gpu_options(self, alloc: Allocation, env: dict[str, str]) -> dict:
        """Only the allocation's GPUs (the MIG device, or the whole GPUs), whatever the image's
        environment says."""
        uuids = [alloc.mig_uuid] if alloc.mig_uuid else alloc.gpu_uuids
        devices = [f"nvidia.com/gpu={uuid}" for uuid in uuids]
        options: dict = {}
        if not self.cdi:
            env["GPUCLOUD_CDI_DEVICES"] = ",".join(devices)
        elif self.gpu_path == "nvidia":
            request = DeviceRequest(driver="nvidia", device_ids=uuids, capabilities=[["gpu"]])
            options["device_requests"] = [request]
            env["NVIDIA_VISIBLE_DEVICES"] = ",".join(uuids)
        else:
            if self.engine == "podman":
                options["devices"] = devices
            else:
                options["device_requests"] = [DeviceRequest(driver="cdi", device_ids=devices)]
            env["NVIDIA_VISIBLE_DEVICES"] = "void"  # no GPUs but the CDI devices
        if alloc.mode == "shared" and self.mps is not None:
            options["volumes_extra"] = self.mps.start(alloc)
            env["CUDA_MPS_PIPE_DIRECTORY"] = CLIENT_PIPE
        return options

    def launch(self, alloc: Allocation, command: list[str] | None, env: dict[str, str], progress):
        """Pull the image if needed, create and start the container; answer (pid, None).
        Raises LaunchError with the reason when it cannot run."""
        try:
            return self._launch(alloc, command, env, progress)
        except (DockerException, requests.RequestException) as exc:
            self._end_mps(alloc)
            raise LaunchError(f"engine_unavailable: {self.engine_url}: {exc}") from exc
        except LaunchError:
            self._end_mps(alloc)
            raise

    def _end_mps(self, alloc: Allocation) -> None:
        """End the MPS daemon of a shared fraction whose container is gone (none: nothing)."""
        if self.mps is not None:
            self.mps.stop(alloc)

    def _launch(self, alloc: Allocation, command: list[str] | None, env: dict[str, str], progress):
        spec = alloc.spec
        reference = spec.get("image")
        if not reference:
            raise LaunchError("launch_failed: the allocation names no image")
        if reference not in self._images or self.images.is_private(reference):
            self._ensure_image(reference, progress, alloc.pull_auth)
            self._images.add(reference)
        alloc.image_digest = self.images.digest_of(reference)
        labels = spec["labels"]
        instance = alloc.instance
        resources = spec.get("resources") or {}
        workspace = self._workspace(alloc)
        env = dict(env)
        gpu = self._gpu_options(alloc, env)
        # Podman's U: as the container starts, the disk's tree is chowned to the container's
        # root (its namespace's), recursively and path by path, as the host's root: safe only
        # while no tenant process can change that tree (_check_disks_free)
        mode = "rw,U" if self.engine == "podman" else "rw"
        volumes = {workspace: {"bind": WORKSPACE, "mode": mode}, **gpu.pop("volumes_extra", {})}
        for volume in spec.get("volumes") or []:
            volumes[self._volume(volume, labels.get("tenant", ""))] = {
                "bind": volume["mount_path"],
                "mode": mode,
            }
        options: dict = {
            "name": container_name(alloc),
            "command": command,
            "environment": env,
            "labels": {
                LABEL_INSTANCE: instance,
                LABEL_TENANT: labels.get("tenant", ""),
                LABEL_ALLOCATION: alloc.id,
            },
            "network": self.networks.ensure(labels.get("tenant") or instance),
            "volumes": volumes,
            "working_dir": WORKSPACE,
            "detach": True,
            "init": True,  # a real init: signals reach the workload, zombies are reaped
            "security_opt": ["no-new-privileges"],
            "cap_drop": DROPPED_CAPABILITIES,
            "pids_limit": min(resources.get("pids") or DEFAULT_PIDS, self.pids_ceiling),
            "ulimits": [],
            "log_config": LOG_CONFIG,
            **gpu,
        }
        if self.layers_bounded:
            options["storage_opt"] = {"size": f"{resources.get('layer_gib') or DEFAULT_LAYER_GIB}G"}
        else:
            progress(LAYER_UNBOUNDED)
        if resources.get("vcpus"):
            cpus, note = cpu_limit(resources["vcpus"], self.machine_cpus)
            options["nano_cpus"] = int(cpus * 1_000_000_000)
            if note:
                progress(note)
        if resources.get("memory_mib"):
            limit = f"{resources['memory_mib']}m"
            options["mem_limit"] = options["memswap_limit"] = limit
        disks = [source for source in volumes if source.startswith(f"{self.disks.root}/")]
        with self._starting:
            self._check_disks_free(disks, alloc.id)
            try:
                container = self._create(reference, options, alloc, progress)
            except ImageNotFound as exc:
                raise LaunchError(f"image_not_found: {reference}") from exc
            except APIError as exc:
                raise LaunchError(f"launch_failed: {exc.explanation or exc}") from exc
            try:
                container.start()
            except APIError as exc:
                self._keep_logs(container, instance)
                with contextlib.suppress(APIError):
                    self._remove(container)
                raise LaunchError(_start_failure(exc)) from exc
        container.reload()
        with self._lock:
            self._exits.pop(alloc.id, None)
        alloc.container = container.name
        return container.attrs["State"].get("Pid") or None, None

    def _check_disks_free(self, disks: list[str], alloc_id: str) -> None:
        """No running container but the allocation's own holds any of its disks (LaunchError
        `volume_busy`): a tenant's process on a disk while Podman chowns its tree for a new
        container (`U`) could swap a folder for a symlink and have a host file chowned. The
        check and the start are one step (`_starting`), so no two containers of a disk start
        together."""
        if not disks:
            return
        listed = self.client.containers.list(sparse=True, filters={"label": LABEL_ALLOCATION})
        for container in listed:
            if (container.attrs.get("Labels") or {}).get(LABEL_ALLOCATION) == alloc_id:
                continue
            held = {mount.get("Source") for mount in container.attrs.get("Mounts") or []}
            for disk in disks:
                if disk in held:
                    raise LaunchError(f"volume_busy: {Path(disk).parent.name} is in use")

    def _create(self, reference: str, options: dict, alloc: Allocation, progress):
        """Create the container, asking the engine only that on the usual path (every call
        is the engine's CPU, which a burst of launches shares): an image removed since it
        was seen here is pulled again; a container of the same name left by an earlier
        allocation of the instance is removed (its output kept) when the engine refuses the
        name."""
        try:
            return self._create_container(reference, options)
        except ImageNotFound:
            self._images.discard(reference)
            self._ensure_image(reference, progress, alloc.pull_auth)
            self._images.add(reference)
        except APIError as exc:
            if not _name_in_use(exc):
                raise
            self._remove_stale(options["name"], alloc.id)
        return self._create_container(reference, options)

    def _create_container(self, reference: str, options: dict):
        """`containers.create`, in a user namespace of its own on Podman (docker-py's
        HostConfig takes no UsernsMode but `host`, so it is set on the request here)."""
        version = self.client.api._version
        request = _create_container_args({**options, "image": reference, "version": version})
        if self.engine == "podman":
            request["host_config"]["UsernsMode"] = PODMAN_USERNS
        return self.client.containers.get(self.client.api.create_container(**request)["Id"])

    def _workspace(self, alloc: Allocation) -> str:
        """What is mounted at /workspace: the allocation's disk (made now on its first
        launch), or an engine volume of that name made by an earlier agent for the same
        instance. LaunchError `volume_foreign` when it was made for another one."""
        volume = alloc.spec.get("volume") or {}
        name = volume.get("name") or volume_name(alloc.instance)
        tenant = alloc.spec["labels"].get("tenant", "")
        if self.disks.record(name) is None:
            with contextlib.suppress(NotFound):
                labels = self.client.volumes.get(name).attrs.get("Labels") or {}
                if labels.get(LABEL_INSTANCE) != alloc.instance or (
                    labels.get(LABEL_TENANT, tenant) != tenant
                ):
                    raise LaunchError(
                        f"volume_foreign: the engine's volume {name} was not made for "
                        f"instance {alloc.instance} of tenant {tenant}"
                    )
                return name
        try:
            mount = self.disks.ensure(name, alloc.instance, tenant, volume.get("size_gib"))
        except DiskError as exc:
            raise LaunchError(f"disk_failed: {exc}") from exc
        self._give_to_root(mount)
        return str(mount)

    def _volume(self, volume: dict, tenant: str) -> str:
        """The mount point of a tenant's volume (its disk made now on its first attach).
        LaunchError `volume_foreign` when that disk was made for another owner."""
        try:
            mount = self.disks.ensure(volume["name"], volume["owner"], tenant, volume["size_gib"])
        except DiskError as exc:
            raise LaunchError(f"disk_failed: {exc}") from exc
        self._give_to_root(mount)
        return str(mount)

    def _give_to_root(self, mount: Path) -> None:
        """Docker has no `U` bind option: the disk's root is given to the remapped root. Safe
        as the host's root: the path is the host's mount point, whose last component is the
        mounted file system's root directory, which no tenant can swap; only that one inode
        changes owner, and nothing inside the tree is followed."""
        if self.remapped_root and mount.stat().st_uid != self.remapped_root[0]:
            os.chown(mount, *self.remapped_root)

    def _remove(self, container) -> None:
        """Remove the container. Podman may answer a container in a user namespace of its own
        that exited a moment ago "unlinkat …/shm: device or resource busy" and yet remove it:
        that is no failure."""
        try:
            container.remove(force=True)
        except APIError:
            try:
                container.reload()
            except NotFound:
                return
            raise

    def _remove_stale(self, name: str, alloc_id: str) -> None:
        """A container of the same name left by an earlier allocation of the instance (the
        agent died between its stop and its removal): keep its output, then remove it."""
        try:
            stale = self.client.containers.get(name)
        except NotFound:
            return
        if stale.labels.get(LABEL_ALLOCATION) != alloc_id:
            self._keep_logs(stale, stale.labels.get(LABEL_INSTANCE, ""))
        self._remove(stale)

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
                    if self.check_engine()["state"] == "up":
                        log.warning("engine events: %s; following again in 1 s", exc)
                time.sleep(1)

        threading.Thread(target=follow, name="engine-events", daemon=True).start()

    def check_engine(self) -> dict:
        """Ping the engine (at most PING_TIMEOUT_SECONDS; blocking: call it off the event
        loop) and answer its state as the heartbeat carries it (EngineState.report)."""
        try:
            with self._ping_lock:
                self._pinger.ping()
        except (DockerException, requests.RequestException) as exc:
            self.engine_state.failed(exc)
        else:
            self.engine_state.answered()
        return self.engine_state.report()

    def cpu_seconds(self, alloc: Allocation) -> float | None:
        """The CPU its container's cgroup used (what its shells ran too), while it runs."""
        return cgroup_seconds(alloc.pid) if alloc.pid else None

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
            return bool(INIT_EXEC_FAILED.search("\n".join(self._output(container, 3))))
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
            self._end_mps(alloc)
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
        self._end_mps(alloc)
        with self._lock:
            self._exits.pop(alloc.id, None)
        if container is None:
            return
        self._keep_logs(container, container.labels.get(LABEL_INSTANCE, ""))
        with contextlib.suppress(NotFound):
            self._remove(container)

    @_engine_answers
    def set_limits(self, alloc: Allocation, resources: dict) -> None:
        """Change the running container's CPU, memory and pids limits in place. Docker takes
        them through its update call; Podman's Docker-compatible API has none before 5.0,
        so its own (libpod) call is used. ApiError 409 `limits_refused` when the engine
        refuses (memory below what the workload holds, on some kernels)."""
        container = self._find(alloc)
        if container is None:
            return
        cpus = cpu_limit(resources["vcpus"], self.machine_cpus)[0] if resources.get("vcpus") else 0
        memory = resources.get("memory_mib", 0) * 1024 * 1024 or None
        pids = min(resources.get("pids") or DEFAULT_PIDS, self.pids_ceiling)
        api = self.client.api
        if self.engine == "podman":
            url = f"{api.base_url}/{LIBPOD_API}/libpod/containers/{container.id}/update"
            body: dict = {"pids": {"limit": pids}}
            if cpus:
                body["cpu"] = {"quota": int(cpus * CPU_PERIOD), "period": CPU_PERIOD}
            if memory:
                body["memory"] = {"limit": memory, "swap": memory}
        else:
            url = api._url("/containers/{0}/update", container.id)
            body = {"PidsLimit": pids}
            if cpus:
                body["NanoCpus"] = int(cpus * 1_000_000_000)
            if memory:
                body["Memory"] = body["MemorySwap"] = memory
        try:
            api._raise_for_status(api._post_json(url, data=body))
        except APIError as exc:
            raise ApiError(
                409, "limits_refused", f"the engine refused the new limits: {exc.explanation}"
            ) from exc

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
        container, behind the gate of agent/sessions.py (it waits, stopped, for its session's
        cgroup); answer the exec id and its raw, bidirectional stream (with tty the terminal's
        bytes as they are; without, Docker's multiplexed frames)."""
        exec_id = self.client.api.exec_create(
            container.id,
            [*GATE, *(command or SHELL)],
            tty=tty,
            stdin=True,
            environment=env,
            workdir=WORKSPACE,
        )["Id"]
        stream = self.client.api.exec_start(exec_id, tty=tty, socket=True)
        return exec_id, stream._sock

    def exec_resize(self, exec_id: str, cols: int, rows: int) -> bool:
        """Size the exec's terminal; False where the engine refused (a session it has not
        finished starting, or one that ended)."""
        try:
            self.client.api.exec_resize(exec_id, height=rows, width=cols)
        except APIError:
            return False
        return True

    def exec_exit_code(self, exec_id: str) -> int | None:
        """The exec's exit code once it has ended (None while it runs, or unknown)."""
        for _ in range(50):
            state = self.client.api.exec_inspect(exec_id)
            if not state.get("Running"):
                return state.get("ExitCode")
            time.sleep(0.02)
        return None

    def exec_pid(self, exec_id: str) -> int | None:
        """The host pid of the exec's process (None until the engine knows it)."""
        return self.client.api.exec_inspect(exec_id).get("Pid") or None

    def container_address(self, container) -> str | None:
        """The container's address on its tenant's network (its ports are reached there)."""
        labels = container.labels
        name = self.networks.name(labels.get(LABEL_TENANT) or labels.get(LABEL_INSTANCE, ""))
        networks = (container.attrs.get("NetworkSettings") or {}).get("Networks") or {}
        return (networks.get(name) or {}).get("IPAddress") or None

    # --- logs and volumes -----------------------------------------------------------------

    def _output(self, container, tail: int | None) -> list[str]:
        """The container's last `tail` lines of output (None: all its capped log holds):
        Podman's read from the end of its log file, since its API reads a long line whole
        into the engine's memory; Docker's through its API."""
        if self.engine == "podman":
            path = container.attrs.get("LogPath")  # none with the journald driver
            return podman_log_tail(Path(path), tail) if path else []
        text = container.logs(stdout=True, stderr=True, tail=tail or "all")
        return text.decode(errors="replace").splitlines()

    def _keep_logs(self, container, instance: str) -> None:
        if not instance:
            return
        try:
            output = self._output(container, None)
        except DockerException as exc:
            log.warning("could not keep the output of %s: %s", container.name, exc)
            return
        keep_output(instance_log(self.log_dir, instance), "\n".join(output).encode())

    @_engine_answers
    def logs(self, instance: str, allocations: list[Allocation], tail: int) -> list[str]:
        """The instance's output on this host, most recent last: what earlier containers
        printed, then the current container's."""
        lines = tail_lines(instance_log(self.log_dir, instance), tail)
        for alloc in allocations:
            container = self._find(alloc)
            with contextlib.suppress(NotFound):  # removed meanwhile: its output is kept above
                if container is not None:
                    lines.extend(self._output(container, tail))
        return lines[-tail:]

    @_engine_answers
    def delete_instance(self, instance: str) -> None:
        """Remove the instance's disks (and engine volumes an earlier agent made for it) and
        its kept output from this host: found by the instance they were made for."""
        try:
            for name in self.disks.of_instance(instance):
                self.disks.delete(name)
        except DiskError as exc:
            raise ApiError(500, "disk_failed", str(exc)) from exc
        for volume in self.client.volumes.list(filters={"label": f"{LABEL_INSTANCE}={instance}"}):
            with contextlib.suppress(NotFound):
                volume.remove(force=True)
        forget_output(self.log_dir, instance)


def _name_in_use(exc: APIError) -> bool:
    """Whether the engine refused a container's name as taken (Docker: 409; Podman: 500)."""
    return exc.status_code == 409 or "already in use" in str(exc.explanation or "")


def _start_failure(exc: APIError) -> str:
    text = str(exc.explanation or exc)
    if "executable file not found" in text or "no such file or directory" in text:
        return f"command_not_found: {text}"
    return f"launch_failed: {text}"
