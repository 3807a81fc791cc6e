"""Live metrics fan-out: N agents x G GPUs pushing 1 Hz samples through the real ASGI server
(uvicorn subprocesses) and Redis to M websocket viewers, each watching one instance.

Everything runs in a throwaway directory: a SQLite database (migrated here, with N hosts of G
GPUs, one whole-GPU instance per GPU, and tenants of 8 instances with a member token each),
Redis (REDIS_URL, else the one `make run` starts: `redis-server` where installed, else the
fakeredis server in a process of its own; `--redis embedded` or `--redis redis-server` picks
one), and `--servers` uvicorn processes. The agents are simulated
in a process of the bench's own: each reads a round (a `gpu` and an `allocation` sample per GPU)
once a second and hands it to the agent's own `Reporter` (agent/control.py), which pushes it to
/agent/v1/samples with its host's secret exactly as a running agent does; latency starts at
the read. The viewers, in another process, are `websockets` clients on
/ws/instances/<id>/metrics/ with a member's bearer token; latency ends when one receives.

Per run it prints: samples in, messages expected and delivered, lost, agent-read → client-
received latency (p50/p99/max), the CPU the server processes (and Redis) used, as cores, and
how late the bench's own two event loops ran (p99): what of a latency is the bench's.
The baseline (`polling`) is the target load watched by plain HTTP polling of the history API
every second instead of websockets.

    .venv/bin/python bench/metrics.py                        # small, target, polling
    .venv/bin/python bench/metrics.py --runs target --seconds 30 --servers 4 --redis redis-server
    .venv/bin/python bench/metrics.py --agents 50 --gpus 8 --viewers 200 --runs custom
"""

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scratch import embedded_redis_process, make_run_redis  # noqa: E402 - bench/ is on the path as a script
from stats import percentile  # noqa: E402 - bench/ is on the path when run as a script

RUNS = {
    "small": {"agents": 10, "gpus": 8, "viewers": 50, "watch": "ws"},
    "target": {"agents": 125, "gpus": 8, "viewers": 500, "watch": "ws"},
    "polling": {"agents": 125, "gpus": 8, "viewers": 500, "watch": "poll"},
}
INSTANCES_PER_TENANT = 8
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """user + system CPU of a process and its reaped children, from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / CLK_TCK


# --- the throwaway installation -------------------------------------------------------------


def prepare_environment(work: Path, redis: str) -> tuple[str, subprocess.Popen | None, str]:
    """Point this process (and the servers it starts) at a fresh database and a Redis:
    (its URL, its process if started here, what it is)."""
    from console import processes

    os.environ["GPUCLOUD_VAR_DIR"] = str(work)
    os.environ["DJANGO_SETTINGS_MODULE"] = "console.settings"
    if not os.environ.get("DATABASE_URL"):
        os.environ["DATABASE_URL"] = ""
        os.environ["GPUCLOUD_SQLITE_PATH"] = str(work / "bench.sqlite3")
    os.environ["LOG_LEVEL"] = "WARNING"
    os.environ["METRICS_ALLOWED_IPS"] = "127.0.0.1"
    url = os.environ.get("REDIS_URL", "")
    if redis == "env" and url:
        return url, None, url
    if redis == "env":
        url, proc, kind = make_run_redis(work)
    elif redis == "redis-server":
        if not shutil.which("redis-server"):
            raise SystemExit("--redis redis-server: no redis-server binary")
        url, proc = processes.start_local_redis(work / "redis.log")
        kind = "redis-server"
    else:
        url, proc = embedded_redis_process()
        kind = "embedded Redis-protocol server"
    os.environ["REDIS_URL"] = url
    return url, proc, kind


@dataclass
class World:
    hosts: list[dict] = field(
        default_factory=list
    )  # {id, secret, gpus: [(index, uuid, alloc, instance)]}
    tokens: dict[int, str] = field(default_factory=dict)  # instance id -> a member's token


def build_world(agents: int, gpus: int) -> World:
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from django.contrib.auth import get_user_model

    from accounts import services as accounts_services
    from accounts.models import Membership, Quota, Tenant
    from accounts.roles import Role
    from console.catalog.models import GpuModel, Image, Mode, Region, Spec
    from console.fleet.models import Gpu, Host
    from console.instances.models import Allocation, Instance, State

    region = Region.objects.create(code="bench-1", name="Bench 1")
    model = GpuModel.objects.create(code="a100-80gb", name="NVIDIA A100 80GB", memory_mib=81920)
    image = Image.objects.create(name="pytorch", cuda_version="12.4")
    spec = Spec.objects.create(
        code="a100x1", name="1x A100", gpu_model=model, mode=Mode.WHOLE, gpu_memory_mib=81920,
        vcpus=8, ram_mib=65536, disk_gib=100, price_per_hour="2.0000",
    )  # fmt: skip
    world = World()
    hosts = []
    for n in range(agents):
        host = Host(
            name=f"bench-{n:04d}", region=region, address=f"http://10.0.{n // 250}.{n % 250}:9101"
        )
        host.set_secret(f"bench-secret-{n:04d}-{random.getrandbits(64):x}")
        hosts.append(host)
    Host.objects.bulk_create(hosts)
    hosts = list(Host.objects.order_by("name"))
    Gpu.objects.bulk_create(
        Gpu(host=h, index=i, uuid=f"GPU-{h.name}-{i}", model=model, name="NVIDIA A100-SXM4-80GB",
            memory_mib=81920, mode=Mode.WHOLE)
        for h in hosts
        for i in range(gpus)
    )  # fmt: skip
    total = agents * gpus
    tenants = Tenant.objects.bulk_create(
        Tenant(name=f"Tenant {t}", slug=f"tenant-{t}")
        for t in range((total + INSTANCES_PER_TENANT - 1) // INSTANCES_PER_TENANT)
    )
    tenants = list(Tenant.objects.order_by("pk"))
    Quota.objects.bulk_create(Quota(tenant=t, gpu_quota=100, max_instances=100) for t in tenants)
    user_model = get_user_model()
    users = user_model.objects.bulk_create(user_model(username=f"viewer-{t.slug}") for t in tenants)
    users = list(user_model.objects.order_by("pk"))
    Membership.objects.bulk_create(
        Membership(user=u, tenant=t, role=Role.VIEWER) for u, t in zip(users, tenants, strict=True)
    )
    instances = Instance.objects.bulk_create(
        Instance(tenant=tenants[k // INSTANCES_PER_TENANT], name=f"i{k}", spec=spec, image=image,
                 region=region, state=State.RUNNING)
        for k in range(total)
    )  # fmt: skip
    instances = list(Instance.objects.order_by("pk"))
    allocations = []
    for k, instance in enumerate(instances):
        host, index = hosts[k // gpus], k % gpus
        allocations.append(
            Allocation(id=f"inst-{instance.pk}-bench", instance=instance, host=host,
                       mode=Mode.WHOLE, request={"mode": "whole", "gpus": [index]})
        )  # fmt: skip
    Allocation.objects.bulk_create(allocations)
    token_of_tenant = {
        t.pk: accounts_services.issue_token(u, t, "bench").raw
        for u, t in zip(users, tenants, strict=True)
    }
    for k, host in enumerate(hosts):
        world.hosts.append(
            {
                "id": host.pk,
                "secret": host.secret,
                "gpus": [
                    (i, f"GPU-{host.name}-{i}", allocations[k * gpus + i].id,
                     instances[k * gpus + i].pk)
                    for i in range(gpus)
                ],
            }
        )  # fmt: skip
    world.tokens = {i.pk: token_of_tenant[i.tenant_id] for i in instances}
    return world


def start_servers(count: int, work: Path) -> list[tuple[subprocess.Popen, str]]:
    from console import processes

    servers = []
    for n in range(count):
        port = processes.free_port()
        log = (work / f"web-{n}.log").open("wb")
        cmd = processes.web_cmd(port)
        env = processes.child_env()
        if os.environ.get("BENCH_ASGI_APP"):  # profiling: a wrapper of console.asgi:application
            cmd[cmd.index("console.asgi:application")] = os.environ["BENCH_ASGI_APP"]
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        servers.append((proc, f"127.0.0.1:{port}"))
    for proc, address in servers:
        processes.wait_http(f"http://{address}/healthz", timeout=60, proc=proc)
    return servers


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- the load ---------------------------------------------------------------------------
#
# The agents and the viewers run in two processes of their own, each with its own event loop:
# in one process, 125 agents' pushes and 500 sockets' messages queued behind each other on one
# loop, and the bench's lateness counted as the server's. Both stamp with the same clock
# (time.time() on this machine): the agents the read, the viewers the arrival. Each process
# also reports how late its own loop ran (`*_lag_p99_ms`), so what is left of the bench in a
# latency can be read off the result.


@dataclass
class Window:
    """The measured seconds: samples read from `start` to `end` count."""

    start: float
    end: float

    def __contains__(self, ts: float) -> bool:
        return self.start <= ts < self.end


@dataclass
class AgentsTally:
    samples_in: int = 0
    posts_failed: int = 0
    post_seconds: list[float] = field(default_factory=list)
    expected: set = field(default_factory=set)  # (instance, ts) of watched instances
    loop_lag: list[float] = field(default_factory=list)
    cpu: float = 0.0


@dataclass
class ViewersTally:
    refused: int = 0
    received: dict = field(default_factory=dict)  # (instance, ts) -> received at (the first)
    duplicates: list = field(default_factory=list)  # ts of samples received more than once
    poll_seconds: list[tuple[float, float]] = field(default_factory=list)  # (at, seconds)
    loop_lag: list[tuple[float, float]] = field(default_factory=list)  # (at, lag)
    cpu: float = 0.0


def reading(ts: float, index: int, uuid: str, alloc: str | None) -> list[dict]:
    util = round(random.uniform(20, 100), 1)
    used = random.randint(1000, 70000)
    base = {
        "ts": ts, "gpu_index": index, "gpu_uuid": uuid, "mig_uuid": None,
        "gpu_util": util, "mem_used_mib": used, "mem_total_mib": 81920,
        "temperature_c": round(random.uniform(40, 80), 1),
        "power_w": round(random.uniform(80, 400), 1), "sm_clock_mhz": 1410, "ecc_errors": 0,
        "healthy": True, "processes": [{"pid": 4242, "used_mib": used}],
    }  # fmt: skip
    samples = [{**base, "kind": "gpu", "allocation": None}]
    if alloc:
        samples.append({**base, "kind": "allocation", "allocation": alloc})
    return samples


async def loop_lag(lags: list, every: float = 0.01) -> None:
    """How late this process's event loop wakes up: (when, seconds late)."""
    while True:
        began = time.monotonic()
        await asyncio.sleep(every)
        lags.append((time.time(), time.monotonic() - began - every))


async def agent(address, host, watched, tally: AgentsTally, window: Window, phase):
    """A host agent's reading and pushing: a round of samples read each second and handed to
    the agent's own Reporter, which pushes it as the real agent does (at once, buffered and
    backing off while the console is away). At the end it stops reading and flushes what is
    buffered, as the agent does when it stops."""
    from agent.control import Reporter

    identity = {"server": f"http://{address}", "host_id": host["id"], "secret": host["secret"]}
    reporter = Reporter(None, identity, 5.0, address)

    async def push() -> None:
        while True:
            await reporter.round_read()
            began = time.monotonic()
            await reporter.push()
            if time.time() in window:
                if reporter.backing_off:
                    tally.posts_failed += 1
                else:
                    tally.post_seconds.append(time.monotonic() - began)
            await asyncio.sleep(reporter.push_delay())

    pusher = asyncio.ensure_future(push())
    try:
        # Each agent reads at its own moment of the second (`phase`), as agents started at
        # different times do. The moments are kept on the clock: setting up the 125 agents
        # blocks this loop for longer than a second, and agents woken after it had all read
        # at once, every second after (95 of 125 in the same 100 ms, each server then taking
        # their pushes in turn: p50 ~180 ms of a push's wait was that queue).
        next_at = window.start - 3.0 + phase
        while True:
            while next_at <= time.time():  # a moment this loop was too late for is skipped
                next_at += 1.0
            if next_at >= window.end:
                break
            await asyncio.sleep(next_at - time.time())
            ts = time.time()
            samples = [
                s for index, uuid, alloc, _ in host["gpus"] for s in reading(ts, index, uuid, alloc)
            ]
            reporter.add(samples)
            if ts in window:
                tally.samples_in += len(samples)
                for _, _, _, instance in host["gpus"]:
                    if instance in watched:
                        tally.expected.add((instance, ts))
    finally:
        pusher.cancel()
        await asyncio.gather(pusher, return_exceptions=True)
        await reporter.flush()
        await reporter.aclose()


async def ws_viewer(address, instance, token, tally: ViewersTally, ready, stop):
    import websockets

    try:
        socket = await websockets.connect(
            f"ws://{address}/ws/instances/{instance}/metrics/",
            additional_headers={"Authorization": f"Bearer {token}"},
            origin=f"http://{address}",
            open_timeout=60,
            max_queue=None,
        )
    except Exception:
        tally.refused += 1
        ready.release()
        return
    ready.release()
    async with socket:
        while not stop.is_set():
            try:
                raw = await socket.recv()
            except websockets.ConnectionClosed:
                return
            now = time.time()
            message = json.loads(raw)
            if message.get("type") != "sample":
                continue
            key = (message["instance"], message["ts"])
            if key in tally.received:
                tally.duplicates.append(message["ts"])
            else:
                tally.received[key] = now


async def poll_viewer(client, address, instance, token, tally: ViewersTally, ready, stop, phase):
    ready.release()
    await asyncio.sleep(phase)
    headers = {"Authorization": f"Bearer {token}"}
    next_at = time.monotonic()
    while not stop.is_set():
        began = time.monotonic()
        try:
            response = await client.get(
                f"http://{address}/api/v1/instances/{instance}/metrics/?range=10m", headers=headers
            )
            data = response.json() if response.status_code == 200 else {"ts": []}
        except Exception:
            data = {"ts": []}
        now = time.time()
        tally.poll_seconds.append((now, time.monotonic() - began))
        for ts in data["ts"]:
            tally.received.setdefault((instance, ts), now)
        next_at += 1.0
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))


def viewers_process(conn, addresses, watched, tokens, watch) -> None:
    """The viewers, in a process of their own: says "ready" once every socket is open, then
    receives until the parent says "stop", and sends back its tally."""
    import httpx

    began = time.process_time()

    async def main() -> ViewersTally:
        tally = ViewersTally()
        ready = asyncio.Semaphore(0)
        stop = asyncio.Event()
        limits = httpx.Limits(max_connections=len(watched) + 10)
        clients = [httpx.AsyncClient(limits=limits, timeout=30) for _ in addresses]
        tasks = []
        for n, instance in enumerate(watched):
            address = addresses[n % len(addresses)]
            if watch == "ws":
                coro = ws_viewer(address, instance, tokens[instance], tally, ready, stop)
            else:
                coro = poll_viewer(clients[n % len(clients)], address, instance, tokens[instance],
                                   tally, ready, stop, phase=n / max(1, len(watched)))  # fmt: skip
            tasks.append(asyncio.ensure_future(coro))
        for _ in watched:
            await ready.acquire()
        lag = asyncio.ensure_future(loop_lag(tally.loop_lag))
        loop = asyncio.get_running_loop()
        conn.send(("ready", tally.refused))
        await loop.run_in_executor(None, conn.recv)  # "stop"
        stop.set()
        for task in [*tasks, lag]:
            task.cancel()
        await asyncio.gather(*tasks, lag, return_exceptions=True)
        for client in clients:
            await client.aclose()
        return tally

    tally = asyncio.run(main())
    tally.cpu = time.process_time() - began
    conn.send(tally)


def agents_process(conn, addresses, hosts, watched, window: Window) -> None:
    """The agents, in a process of their own: they read from 3 s before the window to its
    end, then flush, and the process sends back its tally."""
    began = time.process_time()

    async def main() -> AgentsTally:
        tally = AgentsTally()
        lags: list[tuple[float, float]] = []
        lag = asyncio.ensure_future(loop_lag(lags))
        await asyncio.gather(*[
            agent(addresses[n % len(addresses)], host, watched, tally, window,
                  phase=n / max(1, len(hosts)))
            for n, host in enumerate(hosts)
        ])  # fmt: skip
        lag.cancel()
        tally.loop_lag = [seconds for at, seconds in lags if at in window]
        return tally

    tally = asyncio.run(main())
    tally.cpu = time.process_time() - began
    conn.send(tally)


def drive(world, servers, agents, viewers, watch, warmup, seconds, drain):
    """The viewers connect; then the agents start, and `seconds` after `warmup` count."""
    context = multiprocessing.get_context("fork")  # the world is built here already
    hosts = world.hosts[:agents]
    watched = [inst for host in hosts for _, _, _, inst in host["gpus"]][:viewers]
    addresses = [address for _, address in servers]
    viewers_end, viewers_conn = context.Pipe()
    viewers_proc = context.Process(
        target=viewers_process,
        args=(viewers_conn, addresses, watched, {i: world.tokens[i] for i in watched}, watch),
    )
    viewers_proc.start()
    _, refused = viewers_end.recv()
    window = Window(time.time() + max(warmup, 3.0), 0.0)
    window.end = window.start + seconds
    agents_end, agents_conn = context.Pipe()
    agents_proc = context.Process(
        target=agents_process, args=(agents_conn, addresses, hosts, set(watched), window)
    )
    agents_proc.start()
    time.sleep(max(0.0, window.start - time.time()))
    cpu_before = {proc.pid: cpu_seconds(proc.pid) for proc, _ in servers}
    wall_before = time.monotonic()
    time.sleep(max(0.0, window.end - time.time()))
    cpu_after = {proc.pid: cpu_seconds(proc.pid) for proc, _ in servers}
    wall = time.monotonic() - wall_before
    agents_tally = agents_end.recv()
    agents_proc.join()
    time.sleep(drain)
    viewers_end.send("stop")
    viewers_tally = viewers_end.recv()
    viewers_proc.join()
    server_cpu = sum(cpu_after[p] - cpu_before[p] for p in cpu_after) / wall
    return window, agents_tally, viewers_tally, server_cpu, wall


def run(name, world, work, redis_proc, args, agents, gpus, viewers, watch) -> dict:
    import redis as redis_client

    redis_client.Redis.from_url(os.environ["REDIS_URL"]).flushdb()
    servers = start_servers(args.servers, work)
    redis_before = cpu_seconds(redis_proc.pid) if redis_proc else None
    began = time.monotonic()
    try:
        window, sent, seen, server_cpu, wall = drive(
            world, servers, agents, viewers, watch, args.warmup, args.seconds, args.drain
        )
    finally:
        for proc, _ in servers:
            stop(proc)
    elapsed = time.monotonic() - began
    try:
        redis_memory = redis_client.Redis.from_url(os.environ["REDIS_URL"]).info("memory")[
            "used_memory"
        ]
    except Exception:  # fakeredis answers INFO partly
        redis_memory = None
    redis_cpu = (cpu_seconds(redis_proc.pid) - redis_before) / elapsed if redis_proc else None
    delivered = {key: at for key, at in seen.received.items() if key in sent.expected}
    latencies = [at - ts for (_, ts), at in delivered.items()]
    if os.environ.get("BENCH_TIMELINE"):  # the worst seconds: stalls, and when
        worst: dict[int, float] = {}
        for (_, ts), at in delivered.items():
            second = int(at - window.start)
            worst[second] = max(worst.get(second, 0.0), at - ts)
        print("worst latency per second:", {s: round(v * 1000) for s, v in sorted(worst.items())})
    polls = [seconds for at, seconds in seen.poll_seconds if at in window]
    return {
        "run": name,
        "watch": watch,
        "gpus": agents * gpus,
        "agents": agents,
        "viewers": viewers,
        "servers": args.servers,
        "samples_in": sent.samples_in,
        "samples_per_s": sent.samples_in / args.seconds,
        "expected": len(sent.expected),
        "delivered": len(delivered),
        "lost": len(sent.expected) - len(delivered),
        "duplicates": sum(1 for ts in seen.duplicates if ts in window),
        "refused": seen.refused,
        "posts_failed": sent.posts_failed,
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
        "max_ms": max(latencies, default=float("nan")) * 1000,
        "post_p50_ms": percentile(sent.post_seconds, 50) * 1000,
        "post_p99_ms": percentile(sent.post_seconds, 99) * 1000,
        "poll_p99_ms": percentile(polls, 99) * 1000 if polls else None,
        "agents_lag_p99_ms": percentile(sent.loop_lag, 99) * 1000,
        "viewers_lag_p99_ms": percentile([lag for at, lag in seen.loop_lag if at in window], 99)
        * 1000,
        "server_cpu": server_cpu,
        "redis_cpu": redis_cpu,
        "bench_cpu": (sent.cpu + seen.cpu) / elapsed,
        "seconds": wall,
        "load": os.getloadavg()[0],
        "redis_memory_mib": redis_memory / 2**20 if redis_memory else None,
    }


def table(results: list[dict], redis: str) -> str:
    head = (
        "| run | watch | GPUs (agents x G) | viewers | servers | samples in (/s) "
        "| msgs expected "
        "| delivered | lost | p50 ms | p99 ms | max ms | server CPU (cores) | Redis CPU "
        "| bench CPU | bench loops' lag p99 ms (agents, viewers) | load avg |"
    )
    lines = [head, "|" + "---|" * 17]
    for r in results:
        redis_cpu = f"{r['redis_cpu']:.2f}" if r["redis_cpu"] is not None else "n/a"
        lines.append(
            f"| {r['run']} | {r['watch']} "
            f"| {r['gpus']} ({r['agents']} x {r['gpus'] // r['agents']}) "
            f"| {r['viewers']} | {r['servers']} "
            f"| {r['samples_in']} ({r['samples_per_s']:.0f}) "
            f"| {r['expected']} | {r['delivered']} | {r['lost']} | {r['p50_ms']:.1f} "
            f"| {r['p99_ms']:.1f} | {r['max_ms']:.1f} | {r['server_cpu']:.2f} | {redis_cpu} "
            f"| {r['bench_cpu']:.2f} "
            f"| {r['agents_lag_p99_ms']:.0f}, {r['viewers_lag_p99_ms']:.0f} | {r['load']:.1f} |"
        )
    lines.append(
        f"\nRedis: {redis}. CPU in cores (1.00 = one core busy) over the measured window; "
        f"load avg: the machine's 1-minute load average after the run ({os.cpu_count()} CPUs)."
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="small,target,polling",
                        help=f"comma-separated: {', '.join(RUNS)}, custom")  # fmt: skip
    parser.add_argument("--agents", type=int, default=20, help="custom run: agents")
    parser.add_argument("--gpus", type=int, default=8, help="custom run: GPUs per agent")
    parser.add_argument("--viewers", type=int, default=100, help="custom run: viewers")
    parser.add_argument("--watch", choices=["ws", "poll"], default="ws", help="custom run")
    parser.add_argument("--servers", type=int, default=2, help="uvicorn processes")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per run")
    parser.add_argument(
        "--warmup", type=float, default=6.0,
        help="seconds before the measured ones: setting up 125 agents (an HTTP client each) "
        "holds the agents' process for about 3 s, and their first pushes open connections",
    )  # fmt: skip
    parser.add_argument("--drain", type=float, default=2.0, help="seconds to wait for stragglers")
    parser.add_argument(
        "--redis", choices=["env", "embedded", "redis-server"], default="env",
        help="env: REDIS_URL if set, else make run's (redis-server where installed, else embedded)",
    )  # fmt: skip
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args()

    names = [n.strip() for n in args.runs.split(",") if n.strip()]
    runs = []
    for name in names:
        if name == "custom":
            runs.append(
                (
                    name,
                    {
                        "agents": args.agents,
                        "gpus": args.gpus,
                        "viewers": args.viewers,
                        "watch": args.watch,
                    },
                )
            )
        elif name in RUNS:
            runs.append((name, RUNS[name]))
        else:
            parser.error(f"unknown run {name!r}")
    agents = max(r["agents"] for _, r in runs)
    gpus = max(r["gpus"] for _, r in runs)
    resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)

    work = Path(tempfile.mkdtemp(prefix="gpucloud-bench-metrics-"))
    redis_proc = None
    try:
        redis_url, redis_proc, redis_kind = prepare_environment(work, args.redis)
        print(f"building {agents} hosts x {gpus} GPUs in {work} …", flush=True)
        world = build_world(agents, gpus)

        results = []
        for name, spec in runs:
            print(f"run {name}: {spec} …", flush=True)
            result = run(name, world, work, redis_proc, args, spec["agents"], spec["gpus"],
                         spec["viewers"], spec["watch"])  # fmt: skip
            results.append(result)
            print(json.dumps(result), flush=True)
        print()
        print(table(results, redis_kind))
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2))
    finally:
        if redis_proc is not None:
            stop(redis_proc)
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
