"""Whether this process may read and change MIG instances.

NVIDIA's MIG user guide ("Device Nodes and Capabilities"): root, or any process with
CAP_SYS_ADMIN, holds every nvidia-capability. Otherwise `mig/monitor` lets a process read every
MIG instance of a GPU (placement, GPU instances without a compute instance) and `mig/config`
lets it create and destroy them; each is granted by read access to its device file,
/dev/nvidia-caps/nvidia-cap<minor>, the minor being in /proc/driver/nvidia/capabilities/mig/<name>.
Without /proc/driver/nvidia/capabilities (no MIG-capable driver, or a container that hides it)
this cannot be told from files: NVML's own answers (NO_PERMISSION) then say it.
"""

import os
import re
from dataclasses import dataclass
from pathlib import Path

CAP_SYS_ADMIN = 21
PROC_CAPS = Path("/proc/driver/nvidia/capabilities/mig")
DEV_CAPS = Path("/dev/nvidia-caps")
STATUS = Path("/proc/self/status")


@dataclass(frozen=True)
class MigAccess:
    root: bool
    cap_sys_admin: bool
    config: bool | None  # mig/config: None when it cannot be told
    monitor: bool | None  # mig/monitor

    def may(self, capability: str) -> bool | None:
        """Whether this process holds the capability ("config" or "monitor"); None: unknown."""
        if self.root or self.cap_sys_admin:
            return True
        return getattr(self, capability)

    def describe(self) -> str:
        if self.root:
            return "root: every MIG capability"
        if self.cap_sys_admin:
            return "CAP_SYS_ADMIN: every MIG capability"

        def word(value: bool | None) -> str:
            return {True: "yes", False: "no", None: "cannot tell"}[value]

        return (
            f"not root, no CAP_SYS_ADMIN; mig/monitor: {word(self.monitor)}, "
            f"mig/config: {word(self.config)}"
        )


def _cap_sys_admin(status: Path) -> bool:
    try:
        text = status.read_text()
    except OSError:
        return False
    match = re.search(r"^CapEff:\s*([0-9a-fA-F]+)", text, re.MULTILINE)
    return bool(match and int(match.group(1), 16) & (1 << CAP_SYS_ADMIN))


def _capability(proc_file: Path, dev: Path) -> bool | None:
    try:
        text = proc_file.read_text()
    except OSError:
        return None
    match = re.search(r"DeviceFileMinor:\s*(\d+)", text)
    if match is None:
        return None
    return os.access(dev / f"nvidia-cap{match.group(1)}", os.R_OK)


def mig_access(
    proc: Path = PROC_CAPS, dev: Path = DEV_CAPS, status: Path = STATUS, euid: int | None = None
) -> MigAccess:
    return MigAccess(
        root=(os.geteuid() if euid is None else euid) == 0,
        cap_sys_admin=_cap_sys_admin(status),
        config=_capability(proc / "config", dev),
        monitor=_capability(proc / "monitor", dev),
    )


GRANT_HINT = (
    "run the agent as root (or with CAP_SYS_ADMIN), or give its user read access to the "
    "mig/monitor capability (to read MIG placement) and mig/config (to create and destroy MIG "
    "instances): the device files /dev/nvidia-caps/nvidia-cap<minor> whose minors are in "
    "/proc/driver/nvidia/capabilities/mig/monitor and …/config"
)
