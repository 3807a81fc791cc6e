"""Snapshots and shelving of a volume, against `tar | zstd` of the same data.

A volume as the agent makes one (agent/volumes.py: a loop-mounted ext4 image; root only) is
filled with `--size-mib` of random data (incompressible: what restic and zstd gain on real
data they gain on both sides alike), then:

- snapshot: a full restic backup of it into a repository on this machine (a local folder),
  through the agent's snapshot jobs (agent/snapshots.py), as the console's snapshot asks;
- restore: that snapshot into a new volume;
- shelve: what shelving a stopped instance does on its host: a snapshot of its volume (after
  an earlier one: only what changed since is sent, here a new file of 1/32 of the data), then
  the volume removed;
- unshelve: what starting a shelved instance does on the host it is placed on: its volume
  restored from the shelve's snapshot.

The console's share of shelving (its database rows, placement, the container's start) is not
measured here: seconds of the agent's work per GiB are what grows with a volume. The baseline
is `tar -c | zstd -1 -T0` into a file in the same folder, and `zstd -d | tar -x` back: the
ratio is restic's throughput over the baseline's.

    sudo .venv/bin/python bench/volumes.py              # 2 GiB
    sudo .venv/bin/python bench/volumes.py --size-mib 64
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.snapshots import SnapshotJobs  # noqa: E402
from agent.volumes import GIB, Disks  # noqa: E402

MIB = 1024 * 1024
BLOCK = 4 * MIB
PASSWORD = "bench-only"  # noqa: S105 (a throwaway repository's)


def fill(folder: Path, size: int) -> None:
    """`size` bytes of random data in files of at most 256 MiB."""
    left, index = size, 0
    while left:
        with open(folder / f"random-{index:03d}.bin", "wb") as file:
            part = min(left, 256 * MIB)
            for _ in range(0, part, BLOCK):
                file.write(os.urandom(min(BLOCK, part)))
            left -= part
            index += 1
    os.sync()


def run_job(jobs: SnapshotJobs, job_id: str, body: dict) -> tuple[float, dict]:
    started = time.perf_counter()
    jobs.start(job_id, body)
    while (job := jobs.get(job_id)).state == "running":
        time.sleep(0.02)
    if job.state != "done":
        raise SystemExit(f"{job_id}: {job.error}")
    return time.perf_counter() - started, job.result


def timed(command: str, cwd: Path) -> float:
    started = time.perf_counter()
    subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=cwd, check=True)
    return time.perf_counter() - started


def measure(work: Path, size: int) -> dict:
    disks = Disks(work / "disks")
    size_gib = max(1, -(-size * 5 // 4 // GIB))  # the data and a quarter more
    store = {"repository": str(work / "repo"), "password": PASSWORD}
    jobs = SnapshotJobs(disks, work / "state")
    try:
        mount = disks.ensure("bench-src", "1", "bench", size_gib)
        fill(mount, size)
        snapshot, first = run_job(
            jobs, "snap", {"kind": "backup", "store": store, "volume": "bench-src"}
        )
        copy = {"kind": "restore", "store": store, "volume": "bench-copy", "instance": "2",
            "snapshot": first["snapshot"], "tenant": "bench", "size_gib": size_gib}  # fmt: skip
        restore, _ = run_job(jobs, "restore", copy)
        disks.delete("bench-copy")
        archive = work / "baseline.tar.zst"
        tar = timed(f"tar -cf - . | zstd -q -1 -T0 -o {archive}", mount)
        (work / "untar").mkdir()
        untar = timed(f"zstd -q -d -c {archive} | tar -xf -", work / "untar")
        (mount / "changed.bin").write_bytes(os.urandom(size // 32))
        started = time.perf_counter()
        _, shelved = run_job(
            jobs, "shelve", {"kind": "backup", "store": store, "volume": "bench-src"}
        )
        disks.delete("bench-src")
        shelve = time.perf_counter() - started
        unshelve, _ = run_job(jobs, "unshelve", {"kind": "restore", "store": store,
            "volume": "bench-src", "snapshot": shelved["snapshot"], "instance": "1",
            "tenant": "bench", "size_gib": size_gib})  # fmt: skip
    finally:
        for name in ("bench-src", "bench-copy"):
            disks.delete(name)
    return {
        "size": size,
        "snapshot_s": snapshot,
        "restore_s": restore,
        "tar_s": tar,
        "untar_s": untar,
        "shelve_s": shelve,
        "unshelve_s": unshelve,
        "repository_bytes": sum(
            p.stat().st_size for p in (work / "repo").rglob("*") if p.is_file()
        ),
        "archive_bytes": archive.stat().st_size,
    }


def table(result: dict) -> str:
    mib = result["size"] / MIB
    rows = [
        ("snapshot", result["snapshot_s"], "tar -c \\| zstd -1", result["tar_s"]),
        ("restore", result["restore_s"], "zstd -d \\| tar -x", result["untar_s"]),
    ]
    lines = [
        f"volume: {mib:.0f} MiB of random data; restic repository and baseline on this machine",
        "",
        "| operation | seconds | MiB/s | baseline | seconds | MiB/s | ratio |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for name, seconds, base, base_seconds in rows:
        speed, base_speed = mib / seconds, mib / base_seconds
        lines.append(
            f"| {name} | {seconds:.2f} | {speed:.0f} | {base} | {base_seconds:.2f} "
            f"| {base_speed:.0f} | {speed / base_speed:.2f}x |"
        )
    lines += [
        "",
        "| shelve (snapshot + remove) | unshelve (restore) |",
        "| ---: | ---: |",
        f"| {result['shelve_s']:.2f} s | {result['unshelve_s']:.2f} s |",
        "",
        f"stored: restic {result['repository_bytes'] / MIB:.0f} MiB (two snapshots), "
        f"tar | zstd {result['archive_bytes'] / MIB:.0f} MiB",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=2048, help="the volume's data (MiB)")
    parser.add_argument("--dir", type=Path, help="where to work (default: a new temporary folder)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/volumes.py mounts volumes as the agent does: run it as root")
    for program in ("restic", "zstd", "tar"):
        if shutil.which(program) is None:
            raise SystemExit(f"bench/volumes.py needs {program}: apt-get install {program}")
    work = Path(tempfile.mkdtemp(prefix="gpucloud-bench-volumes-", dir=args.dir))
    try:
        print(table(measure(work, args.size_mib * MIB)))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
