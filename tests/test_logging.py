"""Production logging (issue 16): one line per task outcome, no access line for the agents'
periodic calls, JSON lines on request."""

import json
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from celery import Celery
from django.conf import settings

from console import logs, processes

ROOT = Path(__file__).resolve().parent.parent


def _record(path: str, status: int = 202) -> logging.LogRecord:
    return logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
        ("10.0.0.7:5100", "POST", path, "1.1", status), None,
    )  # fmt: skip


def test_the_agents_periodic_calls_leave_no_access_line_and_everything_else_does():
    keep = logs.SkipAgentPeriodicCalls().filter
    assert not keep(_record("/agent/v1/samples"))
    assert not keep(_record("/agent/v1/heartbeat?x=1", 401))
    assert keep(_record("/agent/v1/register"))
    assert keep(_record("/api/v1/instances/"))


def test_json_lines_carry_time_level_logger_message_and_exception():
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord(
            "console.x", logging.ERROR, __file__, 1, "lost %s", ("gpu-1",), sys.exc_info()
        )
    entry = json.loads(logs.JsonFormatter().format(record))
    assert (entry["level"], entry["logger"], entry["message"]) == (
        "ERROR",
        "console.x",
        "lost gpu-1",
    )
    assert entry["ts"].endswith("+00:00")
    assert "ValueError: boom" in entry["exc"]


@pytest.fixture(scope="module")
def migrated(tmp_path_factory):
    var = tmp_path_factory.mktemp("var")
    env = processes.child_env(GPUCLOUD_VAR_DIR=str(var))
    for name in ("DATABASE_URL", "REDIS_URL", "LOG_LEVEL", "LOG_FORMAT"):
        env.pop(name, None)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    return env


def _wait_for(path: Path, text: str, proc, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = path.read_text(errors="replace")
        if text in log:
            return log
        assert proc.poll() is None, log[-3000:]
        time.sleep(0.2)
    raise AssertionError(f"{text!r} never logged:\n{path.read_text()[-3000:]}")


def test_an_exception_nothing_caught_is_logged_critical_with_its_traceback(monkeypatch, caplog):
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)
    logs.log_uncaught_exceptions()

    def fail():
        raise RuntimeError("disk gone")

    thread = threading.Thread(target=fail, name="uploader")
    with caplog.at_level(logging.CRITICAL, logger="uncaught"):
        thread.start()
        thread.join()
        try:
            fail()
        except RuntimeError:
            sys.excepthook(*sys.exc_info())
    [in_thread, in_process] = caplog.records
    assert in_thread.getMessage() == "thread uploader ends: disk gone"
    assert in_process.getMessage() == "the process ends: disk gone"
    assert all(record.exc_info[1].args == ("disk gone",) for record in caplog.records)


@pytest.mark.integration
def test_a_worker_without_a_level_logs_each_task_received_and_its_outcome(
    migrated, redis_url, tmp_path
):
    env = {**migrated, "REDIS_URL": redis_url, "DEPLOYMENT_NAME": settings.DEPLOYMENT_NAME}
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "console", "worker", "-Q", "logtest",
             "-n", "logtest@%h", "--pool", "solo", "--without-gossip", "--without-mingle"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        _wait_for(log_path, "ready.", worker)
        sender = Celery(
            broker=redis_url, broker_transport_options=settings.CELERY_BROKER_TRANSPORT_OPTIONS
        )
        # the beat's routine task first (its lines are DEBUG), then a launch's (gone: a no-op)
        sender.send_task("console.fleet.tasks.watchdog", queue="logtest")
        sender.send_task("console.instances.tasks.provision", args=[0], queue="logtest")
        text = _wait_for(log_path, "succeeded in", worker)
    finally:
        worker.terminate()
        worker.wait(20)
    lines = [line for line in text.splitlines() if "console.instances.tasks.provision[" in line]
    assert [line.split(": ")[0].split(" ", 2)[2] for line in lines] == [
        "INFO celery.worker.strategy",  # received
        "INFO celery.app.trace",  # its outcome
    ], lines
    assert " succeeded in " in lines[1]
    assert "console.fleet.tasks.watchdog[" not in text


@pytest.mark.integration
def test_uvicorn_logs_requests_but_not_the_agents_periodic_calls_and_json_on_request(
    migrated, tmp_path
):
    port = processes.free_port()
    log_path = tmp_path / "web.log"
    with log_path.open("wb") as log:
        web = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "console.asgi:application", "--port", str(port)],
            cwd=ROOT, env={**migrated, "LOG_FORMAT": "json"}, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        processes.wait_http(f"{url}/healthz", proc=web)
        for _ in range(3):
            httpx.post(f"{url}/agent/v1/samples", content=b"{}")
            httpx.post(f"{url}/agent/v1/heartbeat", json={})
        httpx.get(f"{url}/api/v1/specs/")
        _wait_for(log_path, "/api/v1/specs/", web)
    finally:
        web.terminate()
        web.wait(20)
    entries = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    messages = [entry["message"] for entry in entries]
    assert any('"GET /api/v1/specs/ HTTP/1.1" 401' in m for m in messages), messages
    access = [e["message"] for e in entries if e["logger"] == "uvicorn.access"]
    assert not any("/agent/v1/" in m for m in access), messages
    assert {entry["logger"] for entry in entries} >= {"uvicorn.access", "uvicorn.error"}
