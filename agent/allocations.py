"""Allocations: the request body they are made from, and the record the agent keeps of each."""

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime

from agent.errors import invalid
from agent.gpu_models import mig_profiles
from agent.mig import placement_error

ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
MODES = ("whole", "mig", "shared")
FIELDS = frozenset(
    {
        "mode",
        "gpus",
        "mig",
        "shared",
        "command",
        "env",
        "labels",
        "sim",
        "image",
        "resources",
        "volume",
        "volumes",
    }
)
VOLUME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
MAX_VOLUMES = 16
# Where a tenant's volume may be mounted: an absolute, normalised path of plain names, not the
# instance's own disk nor a place the container's system lives (nor under them).
MOUNT_PATH_PATTERN = re.compile(r"(/[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}){1,8}")
RESERVED_MOUNTS = (
    "/workspace", "/proc", "/sys", "/dev", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64",
    "/libx32", "/usr", "/boot", "/run", "/var", "/tmp",  # noqa: S108 (a path in the container)
)  # fmt: skip
# The environment the agent sets itself or the GPU stack reads (the NVIDIA container toolkit's
# and driver's, CUDA's MPS and device choice): a workload's env may not name it.
RESERVED_ENV = re.compile(r"NVIDIA_|CUDA_MPS_|GPUCLOUD_|CUDA_VISIBLE_DEVICES\Z")
# A variable's name as POSIX shells accept it: nothing a runtime could read as more than a name.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")
MAX_REFERENCE = 512
REQUIRED = ("mode", "gpus")


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def check_id(alloc_id: str) -> None:
    if not ID_PATTERN.fullmatch(alloc_id):
        raise invalid(f"allocation id must match [A-Za-z0-9_-]{{1,64}}: {alloc_id!r}", "invalid_id")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _object(value, what: str, allowed: set[str], required: tuple[str, ...] = ()) -> dict:
    if not isinstance(value, dict):
        raise invalid(f"{what} must be a JSON object")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise invalid(f"unknown field(s) in {what}: {', '.join(unknown)}")
    missing = [name for name in required if name not in value]
    if missing:
        raise invalid(f"missing field(s) in {what}: {', '.join(missing)}")
    return value


def _int_field(obj: dict, name: str, what: str, low: int, high: int | None = None) -> int:
    value = obj[name]
    if not _is_int(value) or value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise invalid(f"{what}.{name} must be an integer {bound}, not {value!r}")
    return value


def _gpu_indices(value, gpu_count: int) -> list[int]:
    if not isinstance(value, list) or not value or not all(_is_int(i) for i in value):
        raise invalid("gpus must be a non-empty list of GPU indices")
    if len(set(value)) != len(value):
        raise invalid(f"gpus lists a GPU twice: {value}")
    for index in value:
        if not 0 <= index < gpu_count:
            raise invalid(f"no GPU {index} on this host ({gpu_count} GPUs)", "unknown_gpu")
    return value


def _mig(value, gpu: dict) -> dict:
    obj = _object(value, "mig", {"profile", "start", "size"}, ("profile", "start"))
    profiles = mig_profiles(gpu["model"])
    name = obj["profile"]
    if name not in profiles:
        known = ", ".join(profiles) or "none"
        raise invalid(
            f"GPU {gpu['index']} ({gpu['model']}) has no MIG profile {name!r}; known: {known}",
            "unknown_mig_profile",
        )
    profile = profiles[name]
    start = _int_field(obj, "start", "mig", 0)
    size = _int_field(obj, "size", "mig", 1) if "size" in obj else profile.size
    error = placement_error(profile, start, size)
    if error:
        raise invalid(error, "illegal_mig_placement")
    return {"profile": name, "start": start, "size": size}


def _shared(value) -> dict:
    obj = _object(value, "shared", {"milli", "memory_mib"}, ("milli", "memory_mib"))
    return {
        "milli": _int_field(obj, "milli", "shared", 1, 1000),
        "memory_mib": _int_field(obj, "memory_mib", "shared", 1),
    }


def _command(value) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(a, str) for a in value):
        raise invalid("command must be a non-empty list of strings")
    return value


def _strings(value, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise invalid(f"{what} must be an object of strings")
    return value


def _env(value) -> dict[str, str]:
    env = _strings(value, "env")
    if bad := sorted(repr(name) for name in env if not ENV_NAME.fullmatch(name)):
        raise invalid(f"env names that are no variable names: {', '.join(bad)}")
    reserved = sorted(name for name in env if RESERVED_ENV.match(name))
    if reserved:
        raise invalid(f"env names the platform's variables: {', '.join(reserved)}", "reserved_env")
    return env


def _image(value) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_REFERENCE:
        raise invalid(f"image must be an OCI reference of at most {MAX_REFERENCE} characters")
    if any(ch.isspace() for ch in value):
        raise invalid(f"image must not contain white space: {value!r}")
    return value


def _resources(value) -> dict | None:
    if value is None:
        return None
    obj = _object(value, "resources", {"vcpus", "memory_mib", "pids", "layer_gib"})
    for name, low in (("vcpus", 1), ("memory_mib", 6), ("pids", 16), ("layer_gib", 1)):
        if name in obj:
            _int_field(obj, name, "resources", low)
    return obj


LIMITS = ("vcpus", "memory_mib", "pids")


def parse_limits(body) -> dict:
    """The body of PUT /v1/allocations/{id}/limits: the limits a live resize changes
    (`{"resources": {"vcpus", "memory_mib", "pids"}}`; one left out is not limited)."""
    body = _object(body, "the body", {"resources"}, ("resources",))
    resources = _resources(_object(body["resources"], "resources", set(LIMITS)))
    return dict(resources or {})


def _volume(value) -> dict | None:
    if value is None:
        return None
    obj = _object(value, "volume", {"name", "size_gib"}, ("name",))
    if not isinstance(obj["name"], str) or not VOLUME_PATTERN.fullmatch(obj["name"]):
        raise invalid(f"volume.name must match {VOLUME_PATTERN.pattern}, not {obj['name']!r}")
    if "size_gib" in obj:
        _int_field(obj, "size_gib", "volume", 1)
    return obj


def mount_path_error(path) -> str | None:
    """Why `path` may not be a volume's mount path (None: it may)."""
    if not isinstance(path, str) or not MOUNT_PATH_PATTERN.fullmatch(path):
        return "must be an absolute path of plain names (letters, digits, _ . -), like /data"
    if any(part in (".", "..") for part in path.split("/")):
        return "must not name . or .."
    for reserved in RESERVED_MOUNTS:
        if path == reserved or path.startswith(f"{reserved}/"):
            return f"must not be {reserved} or under it"
    return None


def _volumes(value) -> list[dict]:
    """A tenant's volumes besides the instance's own disk: each a disk made for `owner`."""
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_VOLUMES:
        raise invalid(f"volumes must be a list of at most {MAX_VOLUMES} objects")
    volumes = []
    for entry in value:
        obj = _object(entry, "volumes[]", {"name", "owner", "size_gib", "mount_path"},
                      ("name", "owner", "size_gib", "mount_path"))  # fmt: skip
        if not isinstance(obj["name"], str) or not VOLUME_PATTERN.fullmatch(obj["name"]):
            raise invalid(f"volumes[].name must match {VOLUME_PATTERN.pattern}")
        if not isinstance(obj["owner"], str) or not ID_PATTERN.fullmatch(obj["owner"]):
            raise invalid("volumes[].owner must match [A-Za-z0-9_-]{1,64}")
        _int_field(obj, "size_gib", "volumes[]", 1)
        error = mount_path_error(obj["mount_path"])
        if error:
            raise invalid(f"volumes[].mount_path {error}: {obj['mount_path']!r}")
        volumes.append(obj)
    paths = sorted(v["mount_path"] for v in volumes)
    if any(b == a or b.startswith(f"{a}/") for a, b in zip(paths, paths[1:], strict=False)):
        raise invalid("volumes[].mount_path: two volumes share a path (or one is inside another)")
    if len({v["name"] for v in volumes}) != len(volumes):
        raise invalid("volumes[].name: a volume is listed twice")
    return volumes


def _sim(value) -> dict | None:
    if value is None:
        return None
    obj = _object(value, "sim", {"util", "mem_mib"})
    util = obj.get("util")
    if util is not None and (not isinstance(util, int | float) or isinstance(util, bool)):
        raise invalid(f"sim.util must be a number, not {util!r}")
    if util is not None and not 0 <= util <= 100:
        raise invalid(f"sim.util must be between 0 and 100, not {util}")
    if "mem_mib" in obj:
        _int_field(obj, "mem_mib", "sim", 0)
    return obj


def parse_spec(body, gpus: list[dict]) -> dict:
    """Check a PUT body against this host's GPUs; answer the normalized allocation spec."""
    body = _object(body, "the body", set(FIELDS), REQUIRED)
    mode = body["mode"]
    if mode not in MODES:
        raise invalid(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    indices = _gpu_indices(body["gpus"], len(gpus))
    if mode != "whole" and len(indices) != 1:
        raise invalid(f"a {mode} allocation takes exactly one GPU, not {len(indices)}")
    for other in ("mig", "shared"):
        if other != mode and body.get(other) is not None:
            raise invalid(f"{other} must be null for a {mode} allocation")
    return {
        "mode": mode,
        "gpus": indices,
        "mig": _mig(body.get("mig"), gpus[indices[0]]) if mode == "mig" else None,
        "shared": _shared(body.get("shared")) if mode == "shared" else None,
        "command": _command(body.get("command")),
        "env": _env(body.get("env")),
        "labels": _strings(body.get("labels"), "labels"),
        "sim": _sim(body.get("sim")),
        "image": _image(body.get("image")),
        "resources": _resources(body.get("resources")),
        "volume": _volume(body.get("volume")),
        "volumes": _volumes(body.get("volumes")),
    }


def parse_registry_auth(value) -> dict | None:
    """The credential the console sends for an allocation's pull ({registry, username,
    password}, or none): kept in memory for that pull only (Allocation.pull_auth)."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"registry", "username", "password"}:
        raise invalid("registry_auth must be {registry, username, password}")
    if not all(isinstance(item, str) and 0 < len(item) <= 4096 for item in value.values()):
        raise invalid("registry_auth's registry, username and password must be strings")
    return dict(value)


def cuda_env(spec: dict, gpu_uuids: list[str], mig_uuid: str | None) -> dict[str, str]:
    """The CUDA variable that names a workload's devices. A shared fraction's limits are not
    here: the runtime sets them through the fraction's MPS control daemon, out of its reach."""
    visible = mig_uuid if spec["mode"] == "mig" else ",".join(gpu_uuids)
    return {"CUDA_VISIBLE_DEVICES": visible}


@dataclass
class Allocation:
    id: str
    spec: dict
    gpu_uuids: list[str]
    mig_uuid: str | None
    env: dict[str, str]
    state: str
    created_at: str
    updated_at: str
    reason: str | None = None
    exit_code: int | None = None
    pid: int | None = None
    pid_start: int | None = None  # the process's start time, to recognise it after a restart
    container: str | None = None  # the oci runtime's container name
    finished_at: str | None = None  # when the workload ended, as the runtime saw it
    # the digest its image was pulled at (sha256:…), which the console pins a tenant's image to
    image_digest: str | None = None
    # the registry credential of its next pull ({registry, username, password}): in memory
    # only, never saved (state.StateStore.save_allocations leaves it out), never shown
    pull_auth: dict | None = field(default=None, repr=False, compare=False)

    @property
    def instance(self) -> str:
        """The console's instance this allocation serves (its own id for a bare one)."""
        return self.spec["labels"].get("instance") or self.id

    @property
    def mode(self) -> str:
        return self.spec["mode"]

    @property
    def gpus(self) -> list[int]:
        return self.spec["gpus"]

    def set_state(
        self,
        state: str,
        reason: str | None = None,
        exit_code: int | None = None,
        finished_at: str | None = None,
    ):
        self.state = state
        self.reason = reason
        self.exit_code = exit_code
        self.updated_at = now_iso()
        self.finished_at = finished_at

    def view(self) -> dict:
        """The allocation as the API shows it."""
        mig = self.spec["mig"]
        return {
            "id": self.id,
            "mode": self.mode,
            "gpus": self.gpus,
            "gpu_uuids": self.gpu_uuids,
            "mig": {**mig, "uuid": self.mig_uuid} if mig else None,
            "shared": self.spec["shared"],
            "state": self.state,
            "reason": self.reason,
            "exit_code": self.exit_code,
            "pid": self.pid,
            "env": self.env,
            "labels": self.spec["labels"],
            "image": self.spec.get("image"),
            "image_digest": self.image_digest,
            "container": self.container,
            "finished_at": self.finished_at,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }
