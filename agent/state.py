"""The agent's state directory: its identity with the control plane, its allocations, and
the GPU modes set through its API.

Every file is written atomically (a temporary file in the same directory, then os.replace).
The directory is 0700 and everything in it 0600 (0700 a directory): the agent runs with umask
077 (PRIVATE_UMASK), which the programs it starts inherit."""

import dataclasses
import json
import os
import secrets
import tempfile
from pathlib import Path

from agent.allocations import Allocation

IDENTITY = "identity.json"
ALLOCATIONS = "allocations.json"
GPU_MODES = "gpu_modes.json"
SSH_KEYS = "ssh_keys.json"
INSTALL_ID = "install_id.json"
PRIVATE_UMASK = 0o077


# what an allocation holds for its next pull only: never on disk
NOT_SAVED = frozenset({"pull_auth"})


def kept(alloc: Allocation) -> dict:
    """An allocation as the state directory keeps it: without its pull's credential."""
    return {
        name: value for name, value in dataclasses.asdict(alloc).items() if name not in NOT_SAVED
    }


class StateStore:
    def __init__(self, root: Path):
        self.root = root
        self.log_dir = root / "logs"
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        root.chmod(0o700)  # an older install's, made with more

    def _read(self, name: str):
        try:
            return json.loads((self.root / name).read_text())
        except FileNotFoundError:
            return None

    def _write(self, name: str, data) -> None:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=self.root)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=2, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.root / name)
        except BaseException:
            os.unlink(tmp)
            raise

    def install_id(self) -> str:
        """This install's id (8 hex digits, made on first use): what the agent names on the
        host (engine networks, firewall chains) carries it, so that no two installs collide."""
        install = self._read(INSTALL_ID)
        if install is None:
            install = secrets.token_hex(4)
            self._write(INSTALL_ID, install)
        return install

    def load_identity(self) -> dict | None:
        return self._read(IDENTITY)

    def save_identity(self, identity: dict) -> None:
        self._write(IDENTITY, identity)

    def load_allocations(self) -> list[Allocation]:
        return [Allocation(**record) for record in self._read(ALLOCATIONS) or []]

    def save_allocations(self, allocations: list[Allocation]) -> None:
        self._write(ALLOCATIONS, [kept(a) for a in allocations])

    def load_gpu_modes(self) -> dict[int, str]:
        return {int(index): mode for index, mode in (self._read(GPU_MODES) or {}).items()}

    def save_gpu_modes(self, modes: dict[int, str]) -> None:
        self._write(GPU_MODES, {str(index): mode for index, mode in modes.items()})

    def load_ssh_keys(self) -> dict[str, list[dict]]:
        return self._read(SSH_KEYS) or {}

    def save_ssh_keys(self, keys: dict[str, list[dict]]) -> None:
        self._write(SSH_KEYS, keys)
