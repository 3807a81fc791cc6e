"""One beat at a time sends the periodic tasks (issue 33, item 6): a second one waits on the
deployment's beat lock and takes over when the first dies."""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis

from console import processes
from console.beat import SCHEDULE_SLOTS, BeatLock, claim_schedule

ROOT = Path(__file__).resolve().parent.parent
SENT = "Sending due task fleet-watchdog"


@pytest.fixture
def client(redis_url):
    return redis.Redis.from_url(redis_url)


def test_one_holder_at_a_time_renewed_given_back_and_taken_over_when_it_expires(client):
    key = f"test-{uuid.uuid4().hex}:beat-lock"
    first, second = BeatLock(client, key, 0.5), BeatLock(client, key, 0.5)
    assert first.hold()
    assert not second.hold()
    assert second.holder() == first.token
    time.sleep(0.3)
    assert first.hold()  # renewed: still its own past the first half-second
    time.sleep(0.3)
    assert not second.hold()
    first.release()
    assert second.hold()  # given back: taken at once
    second.release()
    assert first.hold()
    time.sleep(0.7)  # the holder died: nothing renewed it
    assert second.hold()
    assert not first.hold()  # back, it finds the lock taken and waits
    first.release()  # not its own: this changes nothing
    assert second.holder() == second.token


def test_beats_sharing_a_state_directory_each_keep_a_schedule_file_of_their_own(tmp_path):
    configured = str(tmp_path / "celerybeat-schedule")
    first, first_fd = claim_schedule(configured)
    second, second_fd = claim_schedule(configured)
    assert (first, second) == (configured, f"{configured}.1")
    os.close(first_fd)  # the first beat ended: the next one to start takes its file back
    again, again_fd = claim_schedule(configured)
    assert again == configured
    held = [claim_schedule(configured)[1] for _ in range(SCHEDULE_SLOTS - 2)]
    with pytest.raises(RuntimeError, match="beats already use"):
        claim_schedule(configured)
    for fd in (second_fd, again_fd, *held):
        os.close(fd)
    assert (tmp_path / "celerybeat-schedule.lock").stat().st_mode & 0o777 == 0o600


def _beat(name: str, tmp_path: Path, env: dict) -> tuple[subprocess.Popen, Path]:
    log_path = tmp_path / f"{name}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "console", "beat",
             "--schedule", str(tmp_path / "celerybeat-schedule")],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, process_group=0,
        )  # fmt: skip
    return proc, log_path


def _wait_for(path: Path, text: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = path.read_text(errors="replace")
        if text in log:
            return log
        time.sleep(0.2)
    raise AssertionError(f"{text!r} never logged in {path.name}:\n{path.read_text()[-3000:]}")


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_second_beat_process_waits_and_takes_over_when_the_first_is_killed(
    redis_url, tmp_path, client
):
    deployment = f"beat-test-{uuid.uuid4().hex[:8]}"
    env = processes.child_env(
        REDIS_URL=redis_url, DEPLOYMENT_NAME=deployment, GPUCLOUD_VAR_DIR=str(tmp_path),
        BEAT_LOCK_SECONDS="2", LOG_LEVEL="INFO",
    )  # fmt: skip
    env.pop("DATABASE_URL", None)
    first, first_log = _beat("first", tmp_path, env)
    second = None
    try:
        _wait_for(first_log, SENT)
        second, second_log = _beat("second", tmp_path, env)
        waiting = _wait_for(second_log, "waiting to take over")
        assert f"beat lock {deployment}:beat-lock is held by " in waiting
        time.sleep(3)  # longer than the lock: the first renews it, the second sends nothing
        assert SENT not in second_log.read_text()
        os.killpg(first.pid, signal.SIGKILL)
        killed = time.monotonic()
        took = _wait_for(second_log, SENT, timeout=20)
        assert "took the beat lock" in took
        assert time.monotonic() - killed < 2 + 2  # the lock's period, and a tick
        # both were given one schedule file, as beats sharing a state directory are; each kept
        # its own, so the second never read what the first was writing
        assert (tmp_path / "celerybeat-schedule.1.lock").exists()
        assert "Traceback" not in second_log.read_text()
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for key in client.scan_iter(f"{deployment}:*"):
            client.delete(key)
