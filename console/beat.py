"""Celery beat that runs the periodic tasks only while it holds the deployment's beat lock, so
that a second beat (started by mistake, or as a standby) sends nothing twice: it waits, and
takes over within BEAT_LOCK_SECONDS of the first one's death (and a second: a waiting beat asks
every second; at once when the first stops cleanly, as it gives the lock back). The settings
make it the beat's scheduler.

Each beat keeps its schedule (when each task last ran) in a file of its own: two beats sharing
one state directory would otherwise read the file while the other writes it (a standby died
taking over, on a truncated pickle). The first beat of a directory takes the configured file
(`celerybeat-schedule`), the next ones `celerybeat-schedule.1`, `.2` …, each held with a lock
for the life of its process, so a beat that starts again takes the same one back."""

import fcntl
import logging
import os
import socket
import uuid
from collections.abc import Callable
from pathlib import Path

import redis
from celery.beat import PersistentScheduler
from django.conf import settings

log = logging.getLogger(__name__)

SCHEDULE_SLOTS = 16  # beats that may share one state directory
WAITING_TICK_SECONDS = 1.0  # how often a waiting beat asks for the lock


def claim_schedule(configured: str) -> tuple[str, int]:
    """The schedule file of this beat and the descriptor that holds it: the first of
    `configured`, `configured.1` … whose lock (`<file>.lock`, flock) no other beat holds. The
    descriptor must stay open while the beat runs (the lock ends with the process)."""
    for slot in range(SCHEDULE_SLOTS):
        name = configured if slot == 0 else f"{configured}.{slot}"
        fd = os.open(f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return name, fd
    raise RuntimeError(f"{SCHEDULE_SLOTS} beats already use {configured}: stop one first")


class BeatLock:
    """A lock in Redis held by one beat at a time: taken with SET NX and an expiry, renewed
    and given back by its holder only (compared under WATCH, which plain Redis-protocol servers
    serve too, unlike scripts)."""

    def __init__(self, client: redis.Redis, key: str, seconds: float):
        self.client = client
        self.key = key
        self.ms = int(seconds * 1000)
        self.token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"

    def hold(self) -> bool:
        """Take the lock, or renew it when this holds it; False while another holds it."""
        if self.client.set(self.key, self.token, nx=True, px=self.ms):
            return True
        return self._if_ours(lambda pipe: pipe.pexpire(self.key, self.ms))

    def release(self) -> None:
        self._if_ours(lambda pipe: pipe.delete(self.key))

    def holder(self) -> str:
        value = self.client.get(self.key)
        return value.decode() if value else "nobody"

    def _if_ours(self, action: Callable[[redis.client.Pipeline], object]) -> bool:
        with self.client.pipeline() as pipe:
            try:
                pipe.watch(self.key)
                if pipe.get(self.key) != self.token.encode():
                    return False
                pipe.multi()
                action(pipe)
                pipe.execute()
                return True
            except redis.WatchError:  # it changed hands meanwhile
                return False


def beat_lock() -> BeatLock | None:
    """The deployment's beat lock; None without Redis (a single process: nothing to share)."""
    if not settings.REDIS_URL:
        return None
    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=5)
    return BeatLock(client, f"{settings.DEPLOYMENT_NAME}:beat-lock", settings.BEAT_LOCK_SECONDS)


class LockedScheduler(PersistentScheduler):
    """Ticks (sends what is due) only while holding the beat lock, renewed every tick; ticks
    come at least four times per lock period, so a live holder never lets it expire. Says
    once when it starts waiting, takes the lock, or loses it."""

    def __init__(self, *args, **kwargs):
        self.lock = beat_lock()
        self.holding: bool | None = None  # None: not asked yet
        schedule, self._schedule_lock = claim_schedule(kwargs["schedule_filename"])
        super().__init__(*args, **{**kwargs, "schedule_filename": schedule})

    def _open_schedule(self):
        """The schedule's files (var/celerybeat-schedule*) are the beat's user's alone, as
        every file in the state directory, whatever umask the beat was started with."""
        umask = os.umask(0o077)
        try:
            store = super()._open_schedule()
        finally:
            os.umask(umask)
        path = Path(self.schedule_filename)
        for made in path.parent.glob(f"{path.name}*"):
            made.chmod(0o600)
        return store

    def tick(self, *args, **kwargs) -> float:
        if self.lock is None:
            return super().tick(*args, **kwargs)
        try:
            held, why = self.lock.hold(), ""
        except redis.RedisError as exc:
            held, why = False, f"cannot reach Redis: {exc}"
        if held != self.holding:
            self._say(held, why)
        self.holding = held
        every = settings.BEAT_LOCK_SECONDS / 4
        if held:
            return min(super().tick(*args, **kwargs), every)
        return min(WAITING_TICK_SECONDS, every)

    def _say(self, held: bool, why: str) -> None:
        key = self.lock.key
        if held:
            log.info("beat: took the beat lock %s; running the periodic tasks", key)
            return
        try:
            why = why or f"held by {self.lock.holder()}"
        except redis.RedisError as exc:
            why = f"cannot reach Redis: {exc}"
        if self.holding:
            log.warning("beat: lost the beat lock %s (%s); sending nothing", key, why)
        else:
            log.info("beat: the beat lock %s is %s; waiting to take over", key, why)

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.holding:
                self.lock.release()
                self.holding = False
