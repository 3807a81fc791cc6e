"""The rule: the host never follows a path a tenant controls with host privileges.

A tenant's disk is a file system the tenant writes while the host works on it: any directory
in it may be swapped for a symlink to a host path between two system calls (renameat2
RENAME_EXCHANGE), any file for a FIFO. So a program the agent runs as root on a tenant's
files (restic's backup and restore) runs in a mount namespace of its own, made here, in which:

- the disk's mount point is bound over itself `nosymfollow,nodev,nosuid,noexec` (read-only
  for a backup, writable for a restore): the kernel follows no symlink on it, whoever made it
  and whenever, so every path the program opens there stays on the disk (a path cannot leave
  a file system by renames, and no tenant can mount anything on the host's mount of it);
- the agent's state directory is an empty, read-only tmpfs but for the paths the program
  needs (that disk, restic's cache): the host secret (identity.json), the SSH gateway's host
  key, other instances' kept output and other tenants' disks are not there at all, so that
  even a path that escaped would find nothing of them.

The namespace is made by `unshare --mount --propagation private` and a few `mount` calls in
`sh` before the program is exec'd in its place (the same process: ending it ends the
program). Every path named in the script is the host's own (the state directory, a disk's
mount point), never one inside a tenant's tree. The rest of the agent's work on disks
(agent/volumes.py) touches only the host's own files (image, record, mount point) and the
mount point's root inode; see there.
"""

import shlex
from dataclasses import dataclass
from pathlib import Path

UNSHARE = "/usr/bin/unshare"
CONFINED = "nosymfollow,nodev,nosuid,noexec"


@dataclass(frozen=True)
class Bound:
    """A path the confined program needs, bound in again over the hidden state directory:
    a tenant's disk (confined, read-only unless `writable`) or a host folder (as it is)."""

    path: Path
    tenant: bool = True
    writable: bool = False


def confined(command: list[str], private: Path, bound: list[Bound], cwd: Path) -> list[str]:
    """`command` run in a private mount namespace where `private` (the agent's state
    directory) holds nothing but the `bound` paths, each tenant's disk among them confined;
    it starts in `cwd`."""
    lines = [
        # opened before the tmpfs hides them; bound again from these below
        "exec " + " ".join(f"{3 + i}<{_q(b.path)}" for i, b in enumerate(bound)),
        f"mount -t tmpfs -o mode=0700,size=64k gpucloud-private {_q(private)}",
    ]
    for index, each in enumerate(bound):
        path = _q(each.path)
        lines += [
            f"mkdir -p {path}",
            f"mount --no-canonicalize --bind /proc/self/fd/{3 + index} {path}",
        ]
        if each.tenant:
            mode = "rw" if each.writable else "ro"
            lines.append(f"mount -o remount,bind,{mode},{CONFINED} {path}")
    lines += [
        "exec " + " ".join(f"{3 + i}<&-" for i in range(len(bound))),
        f"mount -o remount,ro {_q(private)}",
        f"cd {_q(cwd)}",
        'exec "$@"',
    ]
    script = "\n".join(lines)
    unshare = [UNSHARE, "--mount", "--propagation", "private", "--"]
    return [*unshare, "sh", "-euc", script, "confined", *command]


def _q(path: Path) -> str:
    return shlex.quote(str(path))
