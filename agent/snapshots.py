"""Volumes' snapshots in a restic repository: the snapshot store the operator configures on
the console (any restic repository string: a local path, `sftp:…`, `s3:…`, `rest:…`), whose
repository and password come with each job and are never written to disk or logged here.
restic reads what its backend needs beyond them (AWS_ACCESS_KEY_ID, …) from the agent's
environment.

A job is one restic run in a thread of its own: `backup` reads a disk's mounted file system as
it is (crash-consistent while its instance runs), `restore` fills a new disk from a snapshot
(and removes that disk again when it fails), `forget` removes snapshots and prunes the data no
other snapshot holds. A backup or forget asked to `measure` answers, beside its outcome, what
the repository holds after it (`Restic.measure`): what its tenant is billed for. restic runs as
root, so a backup or restore runs confined (agent/confine.py): on the disk, the kernel follows
no symlink, and the agent's state directory holds nothing but that disk and restic's cache. A
backup or restore that makes no progress for `STALL_SECONDS` is ended (a FIFO swapped in for a
file between restic's lstat and its open would block the open forever). The console puts a job
under an id of its own and polls it for its progress (bytes done of total, ETA) and outcome.
Jobs live in memory: a restarted agent knows none, and the console then fails the job it
polled.
"""

import contextlib
import hashlib
import json
import logging
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from agent.allocations import VOLUME_PATTERN, check_id
from agent.confine import Bound, confined
from agent.errors import ApiError, conflict, invalid

log = logging.getLogger(__name__)

RESTIC = "/usr/bin/restic"
SNAPSHOT_ID = "[0-9a-f]{8,64}"
KINDS = ("backup", "restore", "forget")
PROGRESS_SECONDS = 1.0
# a backup or restore whose bytes and files done stay the same this long is ended
STALL_SECONDS = 900.0
CACHE = "restic-cache"  # restic's cache, in the state directory
# restic names every snapshot's host as this, so that any host may restore any snapshot
SNAPSHOT_HOST = "gpucloud"
FINISHED_KEPT = 1000
# restic 0.14 has no --retry-lock: a prune waits this long at most for a backup to end
LOCKED_ATTEMPTS = 60
LOCKED_WAIT_SECONDS = 5.0  # finished jobs kept for the console to read their outcome


# one `restic init` at a time: two jobs of a new repository would each make one, and damage it
_INIT_LOCK = threading.Lock()


class ResticError(Exception):
    """restic failed; the message is its last lines of error output."""


Progress = Callable[[int, int, float | None], None]  # bytes done, bytes total, seconds left


@dataclass(frozen=True)
class Store:
    repository: str
    password: str = field(repr=False)


class Restic:
    """restic on one repository: its password and repository in the child's environment
    only (never on a command line that `ps` shows). Backups and restores run confined, with
    `private` (the agent's state directory) hidden but for the disk and the cache."""

    def __init__(
        self,
        store: Store,
        private: Path,
        binary: str = RESTIC,
        stall_seconds: float = STALL_SECONDS,
    ):
        self.store = store
        self.private = private
        self.cache_dir = private / CACHE
        self.binary = binary
        self.stall_seconds = stall_seconds

    def _env(self) -> dict[str, str]:
        env = {
            **os.environ,
            "RESTIC_REPOSITORY": self.store.repository,
            "RESTIC_PASSWORD": self.store.password,
        }
        env.pop("RESTIC_PASSWORD_FILE", None)
        env.pop("RESTIC_PASSWORD_COMMAND", None)
        env["RESTIC_CACHE_DIR"] = str(self.cache_dir)
        return env

    def _confined(self, command: list[str], disk: Path, writable: bool) -> list[str]:
        self.cache_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        bound = [Bound(disk, writable=writable), Bound(self.cache_dir, tenant=False)]
        return confined(command, self.private, bound, cwd=disk)

    def _run(self, *args: str, cwd: Path | None = None) -> str:
        result = subprocess.run(
            [self.binary, *args], env=self._env(), cwd=cwd, capture_output=True, text=True
        )
        if result.returncode != 0:
            raise ResticError(_last_lines(result.stderr))
        return result.stdout

    def ensure_repository(self) -> None:
        """Create the repository on first use (another host may create it meanwhile)."""
        with _INIT_LOCK:
            self._ensure_repository()

    def _ensure_repository(self) -> None:
        try:
            self._run("cat", "config")
        except ResticError:
            try:
                self._run("init")
            except ResticError:
                self._run("cat", "config")  # made by another meanwhile, or a true failure

    def backup(self, path: Path, tags: list[str], progress: Progress) -> dict:
        """Snapshot what lies under `path` (at the snapshot's root); answer {"snapshot": full
        id, "bytes_total": what was read, "bytes_added": new data the store keeps for it}."""
        self.ensure_repository()
        command = [self.binary, "backup", ".", "--json", "--host", SNAPSHOT_HOST]
        for tag in tags:
            command += ["--tag", tag]
        summary: dict = {}
        with subprocess.Popen(
            self._confined(command, path, writable=False),
            env=self._env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as child:
            errors = _drain(child.stderr)
            guard = StallGuard(child, self.stall_seconds)
            for line in child.stdout:
                message = _json_line(line)
                if message.get("message_type") == "status":
                    total = int(message.get("total_bytes") or 0)
                    done = int(message.get("bytes_done") or 0)
                    guard.saw((done, message.get("files_done")))
                    progress(done, total, message.get("seconds_remaining"))
                elif message.get("message_type") == "summary":
                    summary = message
            child.wait()
            guard.stop()
            errors.join()
        if guard.stalled:
            raise ResticError(guard.error("backup"))
        if child.returncode not in (0, 3) or not summary.get("snapshot_id"):
            # 3: some files could not be read (crash-consistent: a file removed meanwhile)
            said = _last_lines("".join(errors.lines))
            raise ResticError(said or f"restic backup exited with {child.returncode}")
        full = json.loads(self._run("snapshots", "--json", summary["snapshot_id"]))
        total = int(summary.get("total_bytes_processed") or 0)
        progress(total, total, 0)
        return {
            "snapshot": full[0]["id"],
            "bytes_total": total,
            "bytes_added": int(summary.get("data_added") or 0),
        }

    def _raw_data(self, snapshots: list[str]) -> int:
        """The bytes the repository stores for the snapshots' data and trees together, each
        blob once (restic `stats --mode raw-data`); none given: for every snapshot."""
        stats = self._run("stats", "--json", "--mode", "raw-data", *snapshots)
        return int(json.loads(stats)["total_size"])

    def measure(self) -> dict:
        """What the repository holds: {"bytes": its total, "snapshots": {id: {"bytes": what
        the snapshot refers to, "unique": what deleting it frees (held by no other snapshot),
        "shared": what it shares with others}}}. The unique part of a snapshot is the total
        less what all the others refer to together, so one restic run per snapshot and
        two more."""
        ids = [s["id"] for s in json.loads(self._run("snapshots", "--json"))]
        total = self._raw_data([]) if ids else 0
        held = {}
        for snapshot in ids:
            others = [other for other in ids if other != snapshot]
            unique = total - (self._raw_data(others) if others else 0)
            own = self._raw_data([snapshot])
            held[snapshot] = {"bytes": own, "unique": unique, "shared": own - unique}
        return {"bytes": total, "snapshots": held}

    def size(self, snapshot: str) -> int:
        """The bytes a restore of the snapshot writes."""
        return int(json.loads(self._run("stats", "--json", snapshot))["total_size"])

    def restore(self, snapshot: str, target: Path, progress: Progress) -> dict:
        """Write the snapshot's files under `target` (an empty disk's mount point); progress
        is what the disk's file system says it holds (restic 0.14 reports none while it
        restores), never read from the restored tree."""
        total = self.size(snapshot)
        started = time.monotonic()
        empty = used_bytes(target)
        command = [self.binary, "restore", snapshot, "--target", str(target)]
        with subprocess.Popen(
            self._confined(command, target, writable=True),
            env=self._env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        ) as child:
            errors = _drain(child.stderr)
            guard = StallGuard(child, self.stall_seconds)
            while child.poll() is None:
                done = min(max(0, used_bytes(target) - empty), total)
                guard.saw(done)
                elapsed = time.monotonic() - started
                left = (total - done) * elapsed / done if done else None
                progress(done, total, left)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(PROGRESS_SECONDS)
            guard.stop()
            errors.join()
        if guard.stalled:
            raise ResticError(guard.error("restore"))
        if child.returncode != 0:
            said = _last_lines("".join(errors.lines))
            raise ResticError(said or f"restic restore exited with {child.returncode}")
        progress(total, total, 0)
        return {"snapshot": snapshot, "bytes_total": total}

    def forget(self, snapshots: list[str]) -> dict:
        """Remove the snapshots and prune the data no other holds; unknown ones are no error
        (a forget that ran already)."""
        known = {s["id"] for s in json.loads(self._run("snapshots", "--json"))}
        gone = [s for s in snapshots if s in known]
        for attempt in range(LOCKED_ATTEMPTS):
            try:
                if gone:
                    self._run("forget", "--prune", *gone)
                break
            except ResticError as exc:  # a backup holds the repository: prune waits for it
                if "locked" not in str(exc) or attempt == LOCKED_ATTEMPTS - 1:
                    raise
                time.sleep(LOCKED_WAIT_SECONDS)
        return {"forgotten": gone}


class _Drain(threading.Thread):
    def __init__(self, stream):
        super().__init__(daemon=True)
        self.stream = stream
        self.lines: list[str] = []

    def run(self) -> None:
        for line in self.stream:
            self.lines.append(line)
            del self.lines[:-20]


def _drain(stream) -> _Drain:
    thread = _Drain(stream)
    thread.start()
    return thread


def _json_line(line: str) -> dict:
    try:
        value = json.loads(line)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _last_lines(text: str, count: int = 3) -> str:
    return " ".join(line.strip() for line in text.strip().splitlines()[-count:])


def used_bytes(mount: Path) -> int:
    """What the file system mounted at `mount` holds (statvfs: the host's mount point, no
    path in the tenant's tree)."""
    stat = os.statvfs(mount)
    return (stat.f_blocks - stat.f_bfree) * stat.f_frsize


class StallGuard(threading.Thread):
    """Ends `child` when what it reports done stays the same for `seconds`."""

    def __init__(self, child: subprocess.Popen, seconds: float):
        super().__init__(daemon=True)
        self.child = child
        self.seconds = seconds
        self.stalled = False
        self._seen: object = None
        self._since = time.monotonic()
        self._done = threading.Event()
        self.start()

    def saw(self, done: object) -> None:
        if done != self._seen:
            self._seen, self._since = done, time.monotonic()

    def run(self) -> None:
        while not self._done.wait(min(self.seconds, PROGRESS_SECONDS)):
            if time.monotonic() - self._since >= self.seconds:
                self.stalled = True
                self.child.kill()
                return

    def stop(self) -> None:
        self._done.set()
        self.join()

    def error(self, kind: str) -> str:
        return (
            f"restic {kind} made no progress for {self.seconds:.0f} s and was ended (a file "
            "that never ends, or a FIFO swapped in for a file while it was read)"
        )


@dataclass
class Job:
    id: str
    kind: str
    # the body's digest, not the body: a finished job kept for the console to read holds no
    # store password (body_digest)
    digest: str
    state: str = "running"  # running, done, failed
    bytes_done: int = 0
    bytes_total: int = 0
    eta_seconds: float | None = None
    result: dict = field(default_factory=dict)
    error: str = ""
    started: float = field(default_factory=time.time)

    def view(self) -> dict:
        return {
            "job": self.id,
            "kind": self.kind,
            "state": self.state,
            "bytes_done": self.bytes_done,
            "bytes_total": self.bytes_total,
            "eta_seconds": None if self.eta_seconds is None else round(self.eta_seconds, 1),
            "result": self.result,
            "error": self.error,
        }


def body_digest(body: dict) -> str:
    """What tells one job's body from another's (the same id sent again is the same job)."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _string(body: dict, key: str, pattern: str | None = None) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise invalid(f"{key} must be a non-empty string")
    if pattern is not None and not re.fullmatch(pattern, value):
        raise invalid(f"{key} must match {pattern}, not {value!r}")
    return value


def parse_job(body) -> tuple[str, Store, dict]:
    """(kind, store, what the kind needs) from a job's body; ApiError 400 when malformed."""
    if not isinstance(body, dict):
        raise invalid("the body must be a JSON object")
    kind = body.get("kind")
    if kind not in KINDS:
        raise invalid(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
    store = body.get("store")
    if not isinstance(store, dict):
        raise invalid('store must be {"repository": …, "password": …}')
    store = Store(_string(store, "repository"), _string(store, "password"))
    args: dict = {}
    if kind in ("backup", "restore"):
        args["volume"] = _string(body, "volume", VOLUME_PATTERN.pattern)
    if kind == "backup":
        tags = body.get("tags", [])
        if not isinstance(tags, list) or not all(isinstance(t, str) and t for t in tags):
            raise invalid("tags must be a list of strings")
        args["tags"] = tags
    if kind == "restore":
        args["snapshot"] = _string(body, "snapshot", SNAPSHOT_ID)
        args["instance"] = _string(body, "instance")
        args["tenant"] = _string(body, "tenant")
        size = body.get("size_gib")
        if type(size) is not int or size < 1:
            raise invalid("size_gib must be a whole number of GiB, at least 1")
        args["size_gib"] = size
    if kind == "forget":
        snapshots = body.get("snapshots")
        if not isinstance(snapshots, list) or not snapshots:
            raise invalid("snapshots must be a non-empty list of snapshot ids")
        for snapshot in snapshots:
            _string({"snapshot": snapshot}, "snapshot", SNAPSHOT_ID)
        args["snapshots"] = snapshots
    if kind in ("backup", "forget"):
        measure = body.get("measure", False)
        if not isinstance(measure, bool):
            raise invalid("measure must be true or false")
        args["measure"] = measure
    return kind, store, args


class SnapshotJobs:
    """The snapshot jobs of this agent, over its disks (agent/volumes.py; None where the
    runtime makes none: every backup and restore is then refused). `private`: the agent's
    state directory (restic's cache is there; a backup or restore sees nothing else of it)."""

    def __init__(
        self, disks, private: Path, binary: str = RESTIC, stall_seconds: float = STALL_SECONDS
    ):
        self.disks = disks
        self.private = private
        self.binary = binary
        self.stall_seconds = stall_seconds
        self.jobs: dict[str, Job] = {}
        self._lock = threading.Lock()

    def get(self, job_id: str) -> Job:
        check_id(job_id)
        job = self.jobs.get(job_id)
        if job is None:
            raise ApiError(404, "not_found", f"no snapshot job {job_id}")
        return job

    def start(self, job_id: str, body) -> tuple[bool, Job]:
        """Start the job; the same id and body again: the job as it stands (created False);
        the same id with another body: 409."""
        check_id(job_id)
        kind, store, args = parse_job(body)
        with self._lock:
            existing = self.jobs.get(job_id)
            if existing is not None:
                if existing.digest != body_digest(body):
                    raise conflict(
                        "job_conflict", f"snapshot job {job_id} exists with another body"
                    )
                return False, existing
            if kind != "forget":
                self._check_disk(kind, args)
            job = Job(job_id, kind, body_digest(body))
            self.jobs[job_id] = job
            self._trim()
        restic = Restic(store, self.private, self.binary, self.stall_seconds)
        threading.Thread(target=self._run, args=(job, restic, args), daemon=True).start()
        return True, job

    def _trim(self) -> None:
        finished = [j for j in self.jobs.values() if j.state != "running"]
        for job in sorted(finished, key=lambda j: j.started)[
            : max(0, len(finished) - FINISHED_KEPT)
        ]:
            del self.jobs[job.id]

    def _check_disk(self, kind: str, args: dict) -> None:
        if self.disks is None:
            raise conflict("no_disks", "this host's runtime keeps no disks to snapshot")
        record = self.disks.record(args["volume"])
        if kind == "backup" and record is None:
            raise ApiError(404, "volume_not_found", f"no volume {args['volume']} on this host")
        if (
            kind == "restore"
            and record is not None
            and (record["instance"] != args["instance"] or record["tenant"] != args["tenant"])
        ):
            raise conflict("volume_exists", f"volume {args['volume']} exists for another")

    def _run(self, job: Job, restic: Restic, args: dict) -> None:
        def progress(done: int, total: int, left: float | None) -> None:
            job.bytes_done, job.bytes_total, job.eta_seconds = done, total, left

        try:
            if job.kind == "backup":
                job.result = restic.backup(self._mounted(args["volume"]), args["tags"], progress)
            elif job.kind == "restore":
                job.result = self._restore(restic, args, progress)
            else:
                job.result = restic.forget(args["snapshots"])
            if args.get("measure"):
                job.result.update(self._measured(job, restic))
        except Exception as exc:  # every failure is the job's outcome, for the console
            job.error = f"{exc.__class__.__name__}: {exc}"
            job.state = "failed"
            log.warning("snapshot job %s (%s) failed: %s", job.id, job.kind, job.error)
        else:
            job.state = "done"
            log.info("snapshot job %s (%s) done: %s", job.id, job.kind, job.result)

    def _measured(self, job: Job, restic: Restic) -> dict:
        """{"store": what the repository holds now}; nothing when restic cannot tell (the job
        did its work all the same: the console keeps its last measurement until the next)."""
        try:
            return {"store": restic.measure()}
        except ResticError as exc:
            log.warning("snapshot job %s could not measure its repository: %s", job.id, exc)
            return {}

    def _restore(self, restic: Restic, args: dict, progress: Progress) -> dict:
        """Fill the disk from the snapshot. A restore that fails removes the disk it was
        filling: a partial copy is nobody's data (the snapshot still holds it whole), and the
        console may restore it again, here or on another host."""
        disk = (args["volume"], args["instance"], args["tenant"])
        try:
            mount = self.disks.ensure(*disk, args["size_gib"])
            return restic.restore(args["snapshot"], mount, progress)
        except Exception:
            self._discard(*disk)
            raise

    def _discard(self, name: str, owner: str, tenant: str) -> None:
        """Remove a failed restore's disk, if it is the restore's own (a disk made for
        another is never touched)."""
        try:
            self.disks.delete_owned(name, owner, tenant)
        except Exception as exc:  # the restore's own error is the one the console needs
            log.warning("the partly restored disk %s stays on this host: %s", name, exc)
        else:
            log.info("the partly restored disk %s was removed", name)

    def _mounted(self, volume: str) -> Path:
        """The volume's mount point, mounted again when the host restarted since."""
        record = self.disks.record(volume)
        return self.disks.ensure(volume, record["instance"], record["tenant"], record["size_gib"])
