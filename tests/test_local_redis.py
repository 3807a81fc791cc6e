"""`make run`'s Redis when no REDIS_URL is given: a redis-server of its own where one is
installed (the live metrics' fan-out needs its speed), else the embedded server; stopped after
everything that uses it."""

import shutil
import subprocess

import pytest
import redis

from console import launcher, processes


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server installed")
def test_an_installed_redis_server_is_started_on_loopback_keeping_nothing_on_disk(tmp_path):
    url, proc = processes.start_local_redis(tmp_path / "redis.log")
    try:
        assert proc is not None and url.startswith("redis://127.0.0.1:")
        client = redis.Redis.from_url(url)
        client.set("greeting", "hello")
        assert client.get("greeting") == b"hello"
        assert client.config_get("save") == {"save": ""}
        assert client.config_get("appendonly") == {"appendonly": "no"}
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["redis.log"]


def test_without_redis_server_the_embedded_server_answers(tmp_path, monkeypatch):
    monkeypatch.setattr(processes.shutil, "which", lambda name: None)
    url, proc = processes.start_local_redis(tmp_path / "redis.log")
    assert proc is None
    assert redis.Redis.from_url(url).ping()


@pytest.mark.integration
def test_a_redis_server_that_cannot_start_is_reported(tmp_path, monkeypatch):
    false = shutil.which("false")
    monkeypatch.setattr(processes.shutil, "which", lambda name: false)
    with pytest.raises(RuntimeError, match="redis-server exited with 1"):
        processes.start_local_redis(tmp_path / "redis.log")


def test_redis_is_stopped_after_the_processes_that_use_it():
    stopped = []

    class Child:
        def __init__(self, name):
            self.name = name

        def poll(self):
            return None

        def terminate(self):
            stopped.append(self.name)

        def wait(self, timeout):
            if self.name == "beat":
                raise subprocess.TimeoutExpired("beat", timeout)

        def kill(self):
            stopped.append(f"killed {self.name}")

    names = ["redis", "web", "worker", "beat"]
    launcher.stop_all([(name, Child(name)) for name in names])
    assert stopped == ["beat", "worker", "web", "killed beat", "redis"]
