"""The README's distributed install, followed as an operator would on PostgreSQL and Redis:
migrate, apply_catalog, createsuperuser, the first tenant and its owner, two web processes,
two named workers, one beat and two agents (each with its --hostname, each given both web
processes). Then what issue 16 asked of it: a launch through one web process is watched live
through the other; a worker SIGKILLed mid-burst leaves no launch behind for more than 30 s; a
web process stopped for longer than the failover time fails no instance, and neither do both
(the console's own outage, not the hosts').

It runs on DATABASE_URL and REDIS_URL when they are set (CI), else on a PostgreSQL and a Redis
on 127.0.0.1 when they answer; otherwise it is skipped. Its database is its own (created and
dropped here) and so is its Redis database number."""

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from console import processes
from tests.backing import own_postgres_and_redis
from tests.harness import Proc

ROOT = Path(__file__).resolve().parent.parent
REDIS_DB = 13  # not the 0 the other tests and make run use
GRACE, FAILOVER = 2, 4  # seconds: short, so that the test outlasts them
HEALTHZ_TOKEN = "monitoring-token"  # noqa: S105 - the test install's, not a secret

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def backing_services():
    with own_postgres_and_redis(REDIS_DB) as urls:
        yield urls


class Install:
    """The README's distributed section, step by step, in one environment."""

    def __init__(self, tmp: Path, database: str, broker: str):
        self.tmp = tmp
        self.env = processes.child_env(
            DATABASE_URL=database,
            REDIS_URL=broker,
            SECRET_KEY=secrets.token_urlsafe(40),
            ALLOWED_HOSTS="console.example.com,127.0.0.1",
            GPUCLOUD_VAR_DIR=str(tmp / "var"),
            DJANGO_SUPERUSER_PASSWORD="a-long-operator-passphrase",
            HOST_HEARTBEAT_GRACE_SECONDS=str(GRACE),
            HOST_FAILOVER_SECONDS=str(FAILOVER),
            HEALTHZ_TOKEN=HEALTHZ_TOKEN,
        )
        self.procs: dict[str, Proc] = {}

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout

    def start(self, name: str, cmd: list[str]) -> Proc:
        self.procs[name] = Proc(name, cmd, self.env, self.tmp)
        return self.procs[name]

    def start_web(self, name: str, port: int) -> Proc:
        cmd = [sys.executable, "-m", "uvicorn", "console.asgi:application",
               "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
        web = self.start(name, cmd)
        processes.wait_http(f"http://127.0.0.1:{port}/healthz", timeout=60, proc=web.popen)
        return web

    def start_worker(self, name: str) -> Proc:
        cmd = [sys.executable, "-m", "celery", "-A", "console", "worker", "-n", f"{name}@%h",
               "-Q", "default,provisioning,metrics,billing", "--concurrency", "2"]  # fmt: skip
        return self.start(name, cmd)

    def api(self, n: int) -> httpx.Client:
        """The REST API through web process `n` (1 or 2), as alice."""
        return httpx.Client(
            base_url=f"{self.urls[n - 1]}/api/v1",
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=15,
        )

    def logs(self) -> str:
        return "\n".join(f"===== {p.name} =====\n{p.log()[-3000:]}" for p in self.procs.values())

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGCONT)  # a frozen one stops too
            proc.stop()


@pytest.fixture(scope="module")
def install(backing_services, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("distributed")
    setup = Install(tmp, *backing_services)
    try:
        # 1. the database, then the catalog; 2. the first operator, tenant and owner
        setup.manage("migrate", "--noinput")
        assert "+ region local-1" in setup.manage(
            "apply_catalog", "console/catalog/examples/catalog.example.toml"
        )
        setup.manage("createsuperuser", "--username", "ops", "--email", "ops@example.com",
                     "--noinput")  # fmt: skip
        setup.manage("create_tenant", "acme", "--name", "Acme AI", "--gpu-quota", "8",
                     "--max-instances", "20")  # fmt: skip
        setup.manage("create_user", "alice", "--tenant", "acme", "--role", "owner",
                     "--email", "alice@acme.example")  # fmt: skip
        setup.token = setup.manage("create_api_token", "alice", "--tenant", "acme").split()[-1]

        # 3. the processes: two web processes, two named workers, one beat
        setup.ports = [processes.free_port(), processes.free_port()]
        setup.urls = [f"http://127.0.0.1:{port}" for port in setup.ports]
        for n in (1, 2):
            setup.start_worker(f"worker{n}")
        setup.start("beat", [sys.executable, "-m", "celery", "-A", "console", "beat"])
        for n, port in enumerate(setup.ports, 1):
            setup.start_web(f"web{n}", port)
        for n in (1, 2):
            setup.procs[f"worker{n}"].wait_for_log("ready.", timeout=60)

        # 4. each host: a join token, then its agent, given both web processes
        for name in ("gpu-a", "gpu-b"):
            token = setup.manage("create_join_token", "--region", "local-1", "--note", name)
            cmd = processes.agent_cmd(
                ",".join(setup.urls), tmp / f"state-{name}", f"127.0.0.1:{processes.free_port()}",
                join_token=token.split()[-1], hostname=name, region="local-1", gpus=4,
                model="a100-80gb", mode="shared", heartbeat_interval=0.5,
            )  # fmt: skip
            setup.start(f"agent-{name}", cmd)
        deadline = time.monotonic() + 60
        while _health(setup.urls[1])["components"]["agents"]["status"] != "ok":
            assert time.monotonic() < deadline, setup.logs()
            time.sleep(0.5)
    except BaseException:
        print(setup.logs())
        setup.stop()
        raise
    yield setup
    setup.stop()


def _health(url: str) -> dict:
    """/healthz with its details, as monitoring reads it (the token)."""
    headers = {"Host": "10.0.0.5", "Authorization": f"Bearer {HEALTHZ_TOKEN}"}
    return httpx.get(f"{url}/healthz", headers=headers, timeout=10).json()


def _states(api: httpx.Client) -> dict[int, str]:
    listed = api.get("/instances/", params={"limit": 500}).json()["results"]
    return {item["id"]: item["state"] for item in listed}


def _launch(api: httpx.Client, name: str) -> int:
    answer = api.post(
        "/instances/", json={"name": name, "spec": "a100-quarter", "image": "demo-busybox"}
    )
    assert answer.status_code == 202, answer.text  # accepted: its host does the rest
    return answer.json()["id"]


class Watcher(threading.Thread):
    """The tenant's live events through one web process's websocket, as a browser gets them."""

    def __init__(self, url: str, token: str):
        super().__init__(daemon=True)
        self.url = url.replace("http", "ws", 1) + "/ws/events/"
        self.token = token
        self.events: list[dict] = []
        self.ready = threading.Event()
        self.closing = threading.Event()
        self.start()
        assert self.ready.wait(10), "no hello on the websocket"

    def run(self):
        from websockets.sync.client import connect

        auth = {"Authorization": f"Bearer {self.token}"}
        with connect(self.url, additional_headers=auth) as socket_:
            self.events.append(json.loads(socket_.recv(timeout=10)))
            self.ready.set()
            while not self.closing.is_set():
                try:
                    self.events.append(json.loads(socket_.recv(timeout=0.2)))
                except TimeoutError:
                    continue

    def states_of(self, instance_id: int) -> list[str]:
        return [
            e["instance"]["state"]
            for e in list(self.events)
            if e.get("type") == "instance.state" and e["instance"]["id"] == instance_id
        ]

    def close(self):
        self.closing.set()
        self.join(5)


def _wait(check, timeout: float, what: str, install: Install):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}\n{install.logs()}")


def test_a_launch_through_one_web_process_is_watched_live_through_the_other(install):
    watcher = Watcher(install.urls[1], install.token)
    assert watcher.events == [{"type": "hello", "tenant": "acme"}]
    try:
        with install.api(1) as api:
            launched = _launch(api, "first")
        _wait(lambda: "running" in watcher.states_of(launched), 30, "running on web2", install)
        assert watcher.states_of(launched)[-2:] == ["provisioning", "running"]
    finally:
        watcher.close()
    with install.api(2) as api:
        assert api.get(f"/instances/{launched}/").json()["state"] == "running"
    health = _health(install.urls[0])
    assert health["status"] == "ok", health
    assert install.procs["beat"].poll() is None
    assert list((install.tmp / "var").glob("celerybeat-schedule*"))


def test_a_worker_killed_mid_burst_leaves_no_launch_behind_for_30_s(install):
    """Ten launches; worker1 is frozen as soon as it has one in hand (so what it holds is
    known from its log), then SIGKILLed: the broker never hears of those tasks again until
    the visibility timeout, yet every instance runs within 30 s of the kill (reconcile adopts
    what the agent already runs and re-drives what never reached it)."""
    worker = install.procs["worker1"]
    received = r"Task console\.instances\.tasks\.provision\[([^\]]+)\] received"
    received_before = len(re.findall(received, worker.log()))
    with install.api(1) as api1, install.api(2) as api2, ThreadPoolExecutor(4) as pool:
        burst = pool.map(lambda n: _launch((api1, api2)[n % 2], f"burst-{n}"), range(10))
        deadline = time.monotonic() + 30
        while len(re.findall(received, worker.log())) == received_before:  # a launch takes
            assert time.monotonic() < deadline, install.logs()  # >100 ms: look every 5 ms
            time.sleep(0.005)
        os.killpg(worker.pid, signal.SIGSTOP)
        launched = list(burst)
        log = worker.log()
        taken = set(re.findall(received, log))
        finished = set(re.findall(r"provision\[([^\]]+)\] succeeded", log))
        in_hand = taken - finished
        assert in_hand, f"worker1 held no launch when frozen:\n{log[-3000:]}"
        worker.kill()
        killed = time.monotonic()

        def all_running():
            states = _states(api2)
            return all(states[pk] == "running" for pk in launched)

        _wait(all_running, 30, f"every launch running ({len(in_hand)} were in hand)", install)
        took = time.monotonic() - killed
        print(f"{len(in_hand)} launch(es) in the killed worker's hand; all running {took:.1f} s "
              "after the kill")  # fmt: skip
        assert took < 30
        assert {s for s in _states(api1).values()} == {"running"}
    install.start_worker("worker1").wait_for_log("ready.", timeout=60)


def _running(install, api: httpx.Client) -> dict[int, str]:
    """The tenant's instances, every one running: the earlier tests' when they ran first, else
    two launched here (a test run again after a failure has the module's install anew)."""
    if not _states(api):
        for name in ("steady-a", "steady-b"):
            _launch(api, name)
    _wait(lambda: set(_states(api).values()) == {"running"}, 60, "instances running", install)
    return _states(api)


def test_a_web_process_down_longer_than_the_failover_time_fails_no_instance(install):
    with install.api(2) as api:
        before = _running(install, api)
        install.procs["web1"].stop()  # the agents were reporting to it, the first given
        time.sleep(FAILOVER * 2.5)
        health = _health(install.urls[1])
        assert health["components"]["agents"]["status"] == "ok", health
        assert _states(api) == before
    for name in ("agent-gpu-a", "agent-gpu-b"):
        assert f"trying {install.urls[1]}" in install.procs[name].log()
    web1 = install.start_web("web1", install.ports[0])
    assert web1.poll() is None
    with install.api(1) as api:
        assert _states(api) == before


def test_every_web_process_down_is_the_consoles_outage_and_fails_no_instance(install):
    """Both web processes down: no agent is heard, the watchdog (beat and the workers still
    run) marks every host unreachable, and past the failover time the console still fails no
    instance, since every host went silent at the same moment; they are adopted back, running,
    once heard."""
    with install.api(2) as api:
        before = _running(install, api)
    for name in ("web1", "web2"):
        install.procs[name].stop()
    # the watchdog runs every 5 s on beat: grace, then failover, each up to a tick late (more
    # on a loaded machine), before the worker says why it held
    deadline = time.monotonic() + GRACE + FAILOVER + 60
    while "2 of 2 hosts went silent together" not in (
        install.procs["worker1"].log() + install.procs["worker2"].log()
    ):
        assert time.monotonic() < deadline, install.logs()
        time.sleep(1)
    for n, port in enumerate(install.ports, 1):
        install.start_web(f"web{n}", port)
    deadline = time.monotonic() + 30
    while _health(install.urls[0])["components"]["agents"]["status"] != "ok":
        assert time.monotonic() < deadline, install.logs()
        time.sleep(0.5)
    with install.api(1) as api:
        # silent, the instances were `unreachable`: heard again, they are adopted back (the
        # next reconcile of their host), and none failed
        deadline = time.monotonic() + 40
        while (states := _states(api)) != before:
            assert "failed" not in states.values(), (states, install.logs())
            assert time.monotonic() < deadline, (states, install.logs())
            time.sleep(0.5)
        assert set(before.values()) == {"running"}
