"""LOG_FORMAT=json: every line a worker and a beat write is JSON, their banners and shutdown
lines included (issue 33, item 13)."""

import json
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
from console.fleet import services as fleet
from tests.factories import GpuModelFactory, RegionFactory

ROOT = Path(__file__).resolve().parent.parent


def _start(name: str, args: list[str], env: dict, tmp_path: Path):
    log_path = tmp_path / f"{name}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "console", *args],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, process_group=0,
        )  # fmt: skip
    return proc, log_path


def _messages(path: Path) -> list[str]:
    """Each line's message; fails on the first line that is not a JSON log entry."""
    messages = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            entry = json.loads(line)
        except ValueError:
            raise AssertionError(f"{path.name} line {number} is not JSON: {line!r}") from None
        assert {"ts", "level", "logger", "message"} <= set(entry), line
        messages.append(entry["message"])
    return messages


def _wait_for(path: Path, text: str, proc, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while text not in path.read_text(errors="replace"):
        assert proc.poll() is None and time.monotonic() < deadline, path.read_text()[-3000:]
        time.sleep(0.2)


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_worker_and_beat_write_only_json_lines_from_start_to_shutdown(redis_url, tmp_path):
    deployment = f"json-logs-{uuid.uuid4().hex[:8]}"
    env = processes.child_env(
        REDIS_URL=redis_url, DEPLOYMENT_NAME=deployment, GPUCLOUD_VAR_DIR=str(tmp_path),
        LOG_FORMAT="json", LOG_LEVEL="INFO", BEAT_LOCK_SECONDS="4",
    )  # fmt: skip
    env.pop("DATABASE_URL", None)
    worker, worker_log = _start(
        "worker", ["worker", "-Q", deployment, "--concurrency", "1"], env, tmp_path
    )
    beat, beat_log = _start("beat", ["beat", "--schedule", str(tmp_path / "s")], env, tmp_path)
    try:
        _wait_for(worker_log, "ready.", worker)
        _wait_for(beat_log, "Sending due task", beat)
    finally:
        for proc in (worker, beat):
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in (worker, beat):
            proc.wait(timeout=30)
        client = redis.Redis.from_url(redis_url)
        for key in client.scan_iter(f"{deployment}:*"):
            client.delete(key)
    worker_says, beat_says = _messages(worker_log), _messages(beat_log)
    banner = next(m for m in worker_says if m.startswith("celery@"))
    assert "transport:" in banner and f".> {deployment}" in banner  # its queue
    assert "worker: Warm shutdown (MainProcess)" in worker_says
    assert any(m.startswith("celery beat v") and "scheduler ->" in m for m in beat_says)
    assert "Scheduler: Sending due task" in "\n".join(beat_says)


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_a_beat_that_crashes_says_why_in_json_lines_only(tmp_path):
    env = processes.child_env(GPUCLOUD_VAR_DIR=str(tmp_path), LOG_FORMAT="json")
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    missing = tmp_path / "no-such-dir" / "schedule"
    beat, beat_log = _start("beat", ["beat", "--schedule", str(missing)], env, tmp_path)
    assert beat.wait(timeout=45) != 0
    said = "\n".join(_messages(beat_log))
    assert "the process ends" in said and "No such file or directory" in said


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_an_agent_writes_only_json_lines_its_http_servers_included(stack, tmp_path):
    """LOG_FORMAT=json reaches the agent too (its own program, its own copy of the format):
    its registration, its HTTP server's lines and its shutdown, each one JSON line."""
    RegionFactory(code="local-1")
    GpuModelFactory()
    _, token = fleet.create_join_token("local-1")
    listen = f"127.0.0.1:{processes.free_port()}"
    cmd = processes.agent_cmd(
        stack.url, tmp_path / "state", listen, join_token=token, hostname="json-1",
        region="local-1", gpus=1, model="a100-80gb", mode="shared",
    )  # fmt: skip
    agent = stack.start("agent-json", cmd, LOG_FORMAT="json")
    agent.wait_for_log("Uvicorn running on")
    agent.stop()
    log_path = tmp_path / "agent.log"
    log_path.write_text(agent.log())
    says = _messages(log_path)
    assert any(m.startswith(f"Uvicorn running on http://{listen}") for m in says)
    assert any("registered with" in m for m in says)
