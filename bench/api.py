"""The REST API under load: 20 concurrent clients on the instances list, an instance's detail
and launch + terminate, against the console's processes started as `make run` starts them.

Embedded mode by default: SQLite and the Redis `make run` starts (redis-server where installed,
else the embedded Redis-protocol server, in a process of its own as the launcher holds it).
With DATABASE_URL and REDIS_URL: the distributed mode, on a fresh database created on that
server for the run (dropped after) and that Redis database (flushed first, so that no task
left there is delivered: give it a number of its own). The web
server runs `make run`'s uvicorn command with as many worker processes as `make run` gives it
(console.processes.web_workers: WEB_CONCURRENCY, else one per core), beside a Celery worker
and one simulated host agent (the `sim` runtime) that the launches really go through.

A tenant with 50 running instances. Each row: requests per second over the load, latency p50
and p99 as the clients saw them, the SQL queries one such request makes (counted in-process on
the same database) and the web processes' CPU time per request (from /proc: what the other
load of a shared machine inflates least). The clients speak plain HTTP/1.1 over kept-alive
connections, so that the load generator takes little of the machine's CPU from the server.
Baseline, measured in the same run and the same way: the same stack's cheapest authenticated
JSON view, a region of the catalog (/api/v1/regions/<code>/: the token check, one row, a small
serializer), which no change to the instances' API makes faster. The target is a ratio to it,
so that it holds across machines: a list page of 50 costs at most 2x its web CPU.

    .venv/bin/python bench/api.py                       # embedded
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres REDIS_URL=redis://127.0.0.1:6379/5 \\
        .venv/bin/python bench/api.py                   # distributed
"""

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scratch import make_run_redis, scratch_var_dir  # noqa: E402 - bench/ is on the path as a script
from stats import percentile  # noqa: E402 - bench/ is on the path when run as a script

LIST = "/api/v1/instances/"
MAX_LIST_CPU_RATIO = 2.0


def cpu_ratio_verdict(page: int, list_ms: float, minimal_ms: float) -> str:
    """The target line: a list page's web CPU as a ratio to the minimal view's."""
    ratio = list_ms / minimal_ms if minimal_ms > 0 else float("inf")
    met = ratio <= MAX_LIST_CPU_RATIO
    return (
        f"target: a list page of {page} costs at most {MAX_LIST_CPU_RATIO:g}x the minimal view's "
        f"web CPU: {list_ms:.2f} / {minimal_ms:.2f} ms = {ratio:.3f}x: {'met' if met else 'MISSED'}"
    )


class Connection:
    """One kept-alive HTTP/1.1 connection: a request, then its whole answer."""

    def __init__(self, port: int, token: str):
        self.port = port
        self.head = f"Host: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        self.reader = self.writer = None

    async def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        data = json.dumps(body).encode() if body is not None else b""
        extra = f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n" if body else ""
        self.writer.write(f"{method} {path} HTTP/1.1\r\n{self.head}{extra}\r\n".encode() + data)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
        if headers.get("transfer-encoding") == "chunked":
            payload = b""
            while size := int((await self.reader.readuntil(b"\r\n"))[:-2], 16):
                payload += (await self.reader.readexactly(size + 2))[:-2]
            await self.reader.readuntil(b"\r\n")
        else:
            payload = await self.reader.readexactly(int(headers.get("content-length", 0)))
        if headers.get("connection") == "close":
            self.writer.close()
            self.writer = None
        return status, payload

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of a process and its children (uvicorn's workers) so far."""
    pids, total = [pid], 0.0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    pids.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    for each in pids:
        try:
            fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


async def load(port: int, token: str, clients: int, seconds: float, step, server: int) -> dict:
    """`clients` connections each running `step(connection, record)` in a loop for `seconds`;
    record(started, status) notes one request. With the web server's CPU time per request
    (`server`: its process id), which the machine's other load does not inflate as it does
    latencies."""
    latencies: list[float] = []
    errors: list[int] = []
    stop_at = time.perf_counter() + seconds

    def record(started: float, status: int) -> None:
        latencies.append(time.perf_counter() - started)
        if status >= 400:
            errors.append(status)

    async def client():
        connection = Connection(port, token)
        try:
            while time.perf_counter() < stop_at:
                await step(connection, record)
        finally:
            connection.close()

    started, cpu = time.perf_counter(), cpu_seconds(server)
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.perf_counter() - started
    return {
        "latencies": latencies,
        "errors": errors,
        "rps": len(latencies) / elapsed,
        "cpu_ms": (cpu_seconds(server) - cpu) * 1000 / max(1, len(latencies)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=50, help="the tenant's instances")
    parser.add_argument("--clients", type=int, default=20, help="concurrent clients")
    parser.add_argument("--seconds", type=float, default=10.0, help="load per endpoint")
    parser.add_argument("--web-workers", type=int, help="uvicorn processes (default: make run's)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs)")
    args = parser.parse_args()

    distributed = bool(os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL"))
    tmp = scratch_var_dir("gpucloud-bench-api-")
    redis_kind = "Redis"
    cleanups = []
    if distributed:
        import dj_database_url
        import psycopg

        server = os.environ["DATABASE_URL"]
        name = f"gpucloud_bench_api_{os.getpid()}"
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")

        def drop():
            with psycopg.connect(server, autocommit=True) as admin:
                admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

        cleanups.append(drop)
        parts = dj_database_url.parse(server)
        auth = parts["USER"] + (f":{parts['PASSWORD']}" if parts["PASSWORD"] else "")
        os.environ["DATABASE_URL"] = f"postgres://{auth}@{parts['HOST']}:{parts['PORT']}/{name}"
        import redis

        redis.Redis.from_url(os.environ["REDIS_URL"]).flushdb()  # no task left from elsewhere
    else:
        os.environ["DATABASE_URL"] = ""
        redis_url, redis_proc, redis_kind = make_run_redis(tmp)

        def stop_redis():
            redis_proc.terminate()
            redis_proc.wait(timeout=10)

        cleanups.append(stop_redis)
        os.environ["REDIS_URL"] = redis_url

    import django

    from console import state_dir

    state_dir.prepare()
    django.setup()
    procs: list = []
    try:
        return run(args, tmp, procs, distributed, redis_kind)
    finally:
        for proc in reversed(procs):
            proc.stop()
        from django.db import connections

        connections.close_all()
        for cleanup in reversed(cleanups):
            cleanup()
        if args.keep:
            print(f"logs in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def run(args, tmp: Path, procs: list, distributed: bool, redis_kind: str) -> int:
    from decimal import Decimal

    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from rest_framework.test import APIClient

    from accounts import services as accounts
    from accounts.roles import Role
    from console import processes
    from console.catalog.models import GpuModel, Image, Mode, Region, Spec
    from console.fleet import services as fleet
    from console.fleet.models import Host
    from console.instances.models import Instance
    from tests.harness import Proc

    call_command("migrate", verbosity=0)
    a100 = GpuModel.objects.create(
        code="a100-80gb", name="NVIDIA A100 80GB", memory_mib=81920, mig_capable=True
    )
    spec = Spec.objects.create(
        code="a100-quarter", name="A100 1/4", mode=Mode.SHARED, milli=250, gpu_model=a100,
        gpu_memory_mib=20480, price_per_hour=Decimal("0.9"), vcpus=1, ram_mib=256, disk_gib=1,
    )  # fmt: skip
    image = Image.objects.create(name="demo", reference="busybox", cuda_version="-", command=[])
    region = Region.objects.create(code="bench-1", name="bench")
    tenant = accounts.create_tenant("bench", gpu_quota="1000", max_instances=10_000)
    user = accounts.ensure_user("bench")
    accounts.add_member(tenant, user, Role.MEMBER)
    token = accounts.issue_token(user, tenant, "bench").raw

    workers = args.web_workers or processes.web_workers()
    env = processes.child_env()
    port = processes.free_port()
    url = f"http://127.0.0.1:{port}"
    procs.append(Proc("web", processes.web_cmd(port, workers=workers), env, tmp))
    procs.append(Proc("worker", processes.worker_cmd(), env, tmp))
    processes.wait_http(f"{url}/healthz", timeout=60, proc=procs[0].popen)
    procs[1].wait_for_log("ready.", timeout=60)
    # room for the 50 and for every client's launch in flight, a quarter GPU each
    gpus = (args.instances + args.clients) // 4 + 2
    _, join = fleet.create_join_token(region)
    procs.append(
        Proc(
            "agent",
            processes.agent_cmd(
                url, tmp / "agent", f"127.0.0.1:{processes.free_port()}", join_token=join,
                hostname="bench-host", region=region.code, gpus=gpus, model="a100-80gb",
                mode=",".join(["shared"] * gpus),
            ),
            env,
            tmp,
        )
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while Host.objects.filter(status="active").first() is None or (
        Host.objects.get().gpus.count() < gpus
    ):
        if time.monotonic() > deadline:
            raise TimeoutError(procs[-1].log()[-2000:])
        time.sleep(0.1)

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    launch = {"spec": spec.code, "image": image.name, "command": ["sleep", "infinity"]}
    for i in range(args.instances):
        answer = client.post(LIST, {"name": f"seed-{i}", **launch}, format="json")
        assert answer.status_code == 202, answer.content
    deadline = time.monotonic() + 120
    while Instance.objects.filter(state="running").count() < args.instances:
        if time.monotonic() > deadline:
            raise TimeoutError("the seed instances did not all reach running")
        time.sleep(0.2)
    ids = list(Instance.objects.values_list("pk", flat=True))

    def queries(method: str, path: str, body: dict | None = None):
        with CaptureQueriesContext(connection) as captured:
            answer = getattr(client, method)(path, body, format="json")
        assert answer.status_code < 300, answer.content
        return len(captured), answer

    minimal = f"/api/v1/regions/{region.code}/"
    counted = {
        "minimal": queries("get", minimal)[0],
        "list": queries("get", LIST)[0],
        "detail": queries("get", f"{LIST}{ids[0]}/")[0],
    }
    counted["launch"], answer = queries("post", LIST, {"name": "counted", **launch})
    counted["terminate"] = queries("post", f"{LIST}{answer.json()['id']}/terminate/")[0]

    async def get_list(connection, record):
        started = time.perf_counter()
        status, _ = await connection.request("GET", LIST)
        record(started, status)

    async def get_minimal(connection, record):
        started = time.perf_counter()
        status, _ = await connection.request("GET", minimal)
        record(started, status)

    async def get_detail(connection, record):
        started = time.perf_counter()
        status, _ = await connection.request("GET", f"{LIST}{random.choice(ids)}/")
        record(started, status)

    serial = iter(range(10**9))

    async def launch_terminate(connection, record):
        started = time.perf_counter()
        status, body = await connection.request(
            "POST", LIST, {"name": f"load-{next(serial)}", **launch}
        )
        record(started, status)
        if status == 202:
            started = time.perf_counter()
            status, _ = await connection.request(
                "POST", f"{LIST}{json.loads(body)['id']}/terminate/"
            )
            record(started, status)

    web = procs[0].pid
    idle = {}  # the web processes' CPU without clients: the agent's samples and heartbeats

    async def measure():
        # warm-up: every process connects, and both paths of the target's ratio have run
        await load(port, token, args.clients, 2, get_list, web)
        await load(port, token, args.clients, 1, get_minimal, web)
        idle_cpu = cpu_seconds(web)
        await asyncio.sleep(3)
        idle["web CPU ms/s"] = (cpu_seconds(web) - idle_cpu) * 1000 / 3
        return {
            "minimal view (baseline)": await load(port, token, args.clients, args.seconds,
                                                  get_minimal, web),
            "list": await load(port, token, args.clients, args.seconds, get_list, web),
            "detail": await load(port, token, args.clients, args.seconds, get_detail, web),
            "launch + terminate": await load(port, token, args.clients, args.seconds,
                                             launch_terminate, web),
        }  # fmt: skip

    results = asyncio.run(measure())
    load_avg = os.getloadavg()[0]

    # leave nothing running on the agent
    for pk in Instance.objects.exclude(state__in=["terminating", "terminated"]).values_list(
        "pk", flat=True
    ):
        client.post(f"{LIST}{pk}/terminate/")
    deadline = time.monotonic() + 120
    while Instance.objects.exclude(state="terminated").exists() and time.monotonic() < deadline:
        time.sleep(0.2)

    print()
    print(
        f"gpucloud API bench: {'distributed' if distributed else 'embedded'} "
        f"({connection.vendor}, {redis_kind}), "
        f"uvicorn with {workers} worker process(es), 1 Celery worker, a tenant with "
        f"{args.instances} running instances, {args.clients} concurrent clients, "
        f"{args.seconds:.0f} s per endpoint, {os.cpu_count()} CPUs, load {load_avg:.1f}; "
        f"web CPU without clients {idle['web CPU ms/s']:.0f} ms/s (the agent's pushes)"
    )
    print()
    print("| endpoint                         | clients | requests |  req/s | p50 ms | p99 ms "
          "| errors | queries/request | web CPU ms/request |")  # fmt: skip
    print("|----------------------------------|---------|----------|--------|--------|--------"
          "|--------|-----------------|--------------------|")  # fmt: skip
    per_request = {
        "minimal view (baseline)": str(counted["minimal"]),
        "list": str(counted["list"]),
        "detail": str(counted["detail"]),
        "launch + terminate": f"{counted['launch']} + {counted['terminate']}",
    }
    for name, got in results.items():
        ms = [v * 1000 for v in got["latencies"]]
        print(
            f"| {name:<32} | {args.clients:>7} | {len(ms):>8} | {got['rps']:>6.0f} "
            f"| {percentile(ms, 50):>6.1f} | {percentile(ms, 99):>6.1f} | {len(got['errors']):>6} "
            f"| {per_request[name]:>15} | {got['cpu_ms']:>18.1f} |"
        )
    for name, got in results.items():
        if got["errors"]:
            statuses = ", ".join(f"{n} × {s}" for s, n in Counter(got["errors"]).most_common())
            print(f"{name}: errors {statuses} (see the web log with --keep)")
    listed, base = results["list"], results["minimal view (baseline)"]
    met = listed["rps"] >= 200 and percentile(listed["latencies"], 99) < 0.25
    print()
    print(f"minimal view (baseline): GET {minimal}")
    print(cpu_ratio_verdict(min(args.instances, 50), listed["cpu_ms"], base["cpu_ms"]))
    print(
        f"the list's req/s {listed['rps'] / base['rps']:.2f}x the minimal view's; "
        f"this machine's earlier absolute target on the list, {args.clients} clients "
        f"(>= 200 req/s with p99 < 250 ms): {'met' if met else 'missed'}"
    )
    return 0 if not any(got["errors"] for got in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
