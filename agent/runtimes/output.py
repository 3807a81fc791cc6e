"""An instance's output kept on this host, in the state directory: what its earlier workloads
printed, readable until the instance is deleted (the process and oci runtimes keep it)."""

import contextlib
import os
from pathlib import Path

# what is kept of an instance's output on this host (its earlier containers'), at most
KEPT_LOG_BYTES = 8 * 1024 * 1024
READ_BLOCK = 64 * 1024


def instance_log(log_dir: Path, instance: str) -> Path:
    """Where an instance's output on this host is kept (every runtime that keeps one)."""
    return log_dir / f"instance-{instance}.log"


def claim_output(log_dir: Path, instance: str, disk: str) -> None:
    """The kept output of `instance` is that of the instance whose disk is `disk`: output an
    earlier instance of the same id left here (another install, or a console whose database
    was reset) is set aside under its own disk's name, never shown to the new one. Only the
    state directory's own files are touched (names the agent makes from checked ids): no
    tenant path is ever followed here; a container's log is the engine's file, which the
    container cannot reach."""
    marker = log_dir / f"instance-{instance}.disk"
    kept = instance_log(log_dir, instance)
    earlier = marker.read_text() if marker.exists() else None
    if earlier == disk:
        return
    log_dir.mkdir(parents=True, exist_ok=True)
    if kept.exists() and earlier is not None:
        kept.rename(log_dir / f"instance-{instance}.{earlier}.log")
    elif kept.exists():  # kept before disks had names: whose it was is unknown
        kept.rename(log_dir / f"instance-{instance}.unclaimed.log")
    marker.write_text(disk)


def forget_output(log_dir: Path, instance: str) -> None:
    """The instance is deleted: its kept output goes, and so does whose disk it was."""
    instance_log(log_dir, instance).unlink(missing_ok=True)
    (log_dir / f"instance-{instance}.disk").unlink(missing_ok=True)


def file_end(path: Path, max_bytes: int, enough=lambda chunk: False) -> bytes:
    """The end of a file from the start of a line, read backwards (a block, then twice as much,
    ...) until `enough(chunk)` or `max_bytes`: never the whole of a big file. Empty when there
    is no such file."""
    with contextlib.suppress(FileNotFoundError), open(path, "rb") as file:
        size = file.seek(0, os.SEEK_END)
        want = READ_BLOCK
        while True:
            start = max(0, size - min(want, max_bytes))
            file.seek(start)
            chunk = file.read(size - start)
            if start > 0:
                chunk = chunk.partition(b"\n")[2]
            if start == 0 or want >= max_bytes or enough(chunk):
                return chunk
            want *= 2
    return b""


def tail_lines(path: Path, tail: int) -> list[str]:
    """The last `tail` lines of a text file (none when there is no such file)."""
    chunk = file_end(path, KEPT_LOG_BYTES, lambda chunk: chunk.count(b"\n") > tail)
    return chunk.decode(errors="replace").splitlines()[-tail:]


def keep_output(path: Path, output: bytes) -> None:
    """Append `output` to an instance's kept output, which keeps only its last
    KEPT_LOG_BYTES (from the start of a line)."""
    if not output:
        return
    if not output.endswith(b"\n"):
        output += b"\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    size = path.stat().st_size if path.exists() else 0
    if size + len(output) <= KEPT_LOG_BYTES:
        with open(path, "ab") as kept:
            kept.write(output)
        return
    output = output[-KEPT_LOG_BYTES:]
    room = KEPT_LOG_BYTES - len(output)
    earlier = file_end(path, room) if room else b""
    partial = path.with_name(path.name + ".new")
    partial.write_bytes(earlier + output)
    partial.replace(path)
