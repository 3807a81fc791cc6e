"""Instances' disks: each one a fixed-size ext4 file system in a sparse image file under the
agent's state directory, mounted by loop and bound at /workspace, so a write past its size
fails with ENOSPC inside the container and nothing outside it grows beyond the image.

A disk is `<root>/<name>/` with `disk.json` (who it was made for: its owner, an instance or
a tenant's volume `volume-<id>`, under the key `instance`; its tenant; its size),
`disk.img` and the mount point `mnt/`. The record is written before the image, so whatever
lies under a name was made by this agent for the instance it names; a launch that names a
disk made for another instance (or another tenant) is refused. A disk stays mounted from its
first launch until the instance is deleted (or the host restarts: the next launch mounts it
again); a bigger size asked for grows it in place. A volume's disk is mounted into each
container of the instances it is attached to, one at a time, and outlives them: it goes when the
volume is deleted. An instance's disk kept at its terminate becomes a volume's (`adopt`).

The host never follows a path a tenant controls with host privileges (agent/confine.py).
What this module does as root touches only the host's own paths: the record and the image
in a 0700 folder no container sees, the mount point (mkdir, mount, umount, rmdir) and the
loop device (losetup, resize2fs grow the file system from the device, not through files);
nothing here opens a path inside the tenant's file system. restic, which does, runs confined.
"""

import contextlib
import json
import os
import subprocess
import threading
from pathlib import Path

from agent.runtimes import LaunchError

RECORD = "disk.json"
IMAGE = "disk.img"
MOUNT = "mnt"
GIB = 1024**3
DEFAULT_SIZE_GIB = 10
# mkfs writes no inode tables or journal blocks up front: a 200 GiB image takes 6 MiB
LAZY = "lazy_itable_init=1,lazy_journal_init=1"
# the kernel does not zero the inode tables behind the tenant's back (mkfs left them lazy)
MOUNT_OPTIONS = "loop,nosuid,nodev,noinit_itable"


class DiskError(Exception):
    """A command on a disk failed (mkfs, mount, resize, umount)."""


def _run(*command: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise DiskError(f"{' '.join(command)}: {result.stderr.strip()}")


def _mounted_device(mount: Path) -> str | None:
    """The loop device mounted at `mount`, or None."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        device, point, *_ = line.split(" ")
        if point == str(mount):
            return device
    return None


class Disks:
    def __init__(self, root: Path):
        self.root = root
        self._lock = threading.Lock()

    def record(self, name: str) -> dict | None:
        try:
            return json.loads((self.root / name / RECORD).read_text())
        except FileNotFoundError:
            return None

    def ensure(self, name: str, instance: str, tenant: str, size_gib: int | None) -> Path:
        """The disk `name` of the instance, made (or grown) to `size_gib` and mounted;
        answer its mount point. LaunchError `volume_foreign` when it was made for another."""
        with self._lock:
            return self._ensure(name, instance, tenant, size_gib)

    def _ensure(self, name: str, instance: str, tenant: str, size_gib: int | None) -> Path:
        folder = self.root / name
        record = self.record(name)
        if record is None:
            if folder.exists():
                raise LaunchError(f"volume_foreign: {name} was not made by this agent")
            folder.mkdir(parents=True, mode=0o700)
            record = {"instance": instance, "tenant": tenant, "size_gib": 0}
        elif (record["instance"], record["tenant"]) != (instance, tenant):
            raise LaunchError(
                f"volume_foreign: {name} belongs to instance {record['instance']} "
                f"of tenant {record['tenant']}, not to instance {instance} of tenant {tenant}"
            )
        size = max(size_gib or DEFAULT_SIZE_GIB, record["size_gib"])
        self._write(folder, {**record, "size_gib": size})
        image, mount = folder / IMAGE, folder / MOUNT
        if not image.exists():
            self._make(image, size)
        mount.mkdir(exist_ok=True)
        device = _mounted_device(mount)
        if device is None:
            _run("mount", "-o", MOUNT_OPTIONS, str(image), str(mount))
            device = _mounted_device(mount)
        if image.stat().st_size < size * GIB:
            os.truncate(image, size * GIB)
            _run("losetup", "--set-capacity", device)
            _run("resize2fs", device)
        return mount

    def _write(self, folder: Path, record: dict) -> None:
        partial = folder / f".{RECORD}"
        partial.write_text(json.dumps(record))
        partial.replace(folder / RECORD)

    def _make(self, image: Path, size_gib: int) -> None:
        """A sparse image with an empty ext4 file system (no blocks kept for the host's root:
        the container's root is not it)."""
        partial = image.with_name(f".{image.name}")
        with open(partial, "wb") as file:
            file.truncate(size_gib * GIB)
        _run("mkfs.ext4", "-q", "-F", "-m", "0", "-E", LAZY, str(partial))
        partial.replace(image)

    def of_instance(self, instance: str) -> list[str]:
        """The names of the disks made for the instance."""
        if not self.root.exists():
            return []
        return sorted(
            entry.name
            for entry in self.root.iterdir()
            if (self.record(entry.name) or {}).get("instance") == instance
        )

    def adopt(self, name: str, instance: str, owner: str, tenant: str) -> None:
        """The disk made for `instance` is `owner`'s from now on (the instance's delete leaves
        it). Done already: nothing. LaunchError `volume_foreign` when it is someone else's;
        DiskError when there is no such disk."""
        with self._lock:
            record = self.record(name)
            if record is None:
                raise DiskError(f"no disk {name} on this host")
            if (record["instance"], record["tenant"]) == (owner, tenant):
                return
            if (record["instance"], record["tenant"]) != (instance, tenant):
                raise LaunchError(f"volume_foreign: {name} was not made for instance {instance}")
            # the record only, in the host's folder: the tenant's tree is not touched
            self._write(self.root / name, {**record, "instance": owner})

    def delete_owned(self, name: str, owner: str, tenant: str) -> None:
        """Delete the disk if it is `owner`'s (gone already: nothing). LaunchError
        `volume_foreign` when it is someone else's."""
        record = self.record(name)
        if record is None:
            return
        if (record["instance"], record["tenant"]) != (owner, tenant):
            raise LaunchError(f"volume_foreign: {name} is not {owner}'s")
        self.delete(name)

    def delete(self, name: str) -> None:
        """Unmount the disk and remove it: its image, record and mount point, each by its
        name. Nothing in the tenant's file system is walked or followed: a mount point that
        is not empty once unmounted (mounted twice) fails the delete."""
        folder = self.root / name
        mount = folder / MOUNT
        with self._lock:
            if _mounted_device(mount) is not None:
                _run("umount", str(mount))
            for entry in (RECORD, IMAGE, f".{RECORD}", f".{IMAGE}"):
                (folder / entry).unlink(missing_ok=True)
            try:
                mount.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise DiskError(f"the disk {name} is still mounted or not empty: {exc}") from exc
            with contextlib.suppress(FileNotFoundError):
                folder.rmdir()
