"""Podman as this project runs it: with the settings in containers.conf beside this file
(cgroupfs, runc, no `nofile` ulimit) and, where asked, on a storage of its own. `make images`
builds with it on a GPU host (agent/images.py); the development tooling starts its service
with it (agent/devtools/engine.py).
"""

import hashlib
import os
from pathlib import Path

CONTAINERS_CONF = Path(__file__).with_name("containers.conf")


class EngineError(Exception):
    pass


def podman_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def podman_command(storage: Path | None, *args: str) -> list[str]:
    """A podman command line; with `storage`, on images, containers, networks and libpod's
    state of its own there (the tests keep theirs apart from the demo's, and their `system
    reset` removes no network or state of another install: Podman keeps both apart from its
    storage by default)."""
    where = []
    if storage:
        runroot = str(storage / "run")
        if len(runroot) > 50:  # Podman refuses a longer runroot
            runroot = f"/run/gpucloud-podman-{hashlib.sha256(runroot.encode()).hexdigest()[:12]}"
        where = ["--root", str(storage / "root"), "--runroot", runroot]
        where += ["--network-config-dir", str(storage / "networks")]
        where += ["--tmpdir", str(storage / "tmp")]
        if storage_driver(storage):
            where += ["--storage-driver", storage_driver(storage)]
    return ["podman", *where, *args]


def mount_type(point: Path) -> str | None:
    """The file system type mounted at `point`, or None."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, where, kind, *_ = line.split(" ")
        if where == str(point):
            return kind
    return None


def storage_driver(storage: Path | None) -> str | None:
    """The storage driver for engine storage at `storage`: btrfs on btrfs (its own driver
    bounds a container's layer, with quota groups), else the engine's default (overlay)."""
    return "btrfs" if storage and mount_type(storage) == "btrfs" else None
