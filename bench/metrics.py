"""Live metrics fan-out: N agents x G GPUs pushing 1 Hz samples through the real ASGI server
(uvicorn subprocesses) and Redis to M websocket viewers, each watching one instance.

Everything runs in a throwaway directory: a SQLite database (migrated here, with N hosts of G
GPUs, one whole-GPU instance per GPU, and tenants of 8 instances with a member token each),
Redis (REDIS_URL, else the one `make run` starts: `redis-server` where installed, else the
fakeredis server in a process of its own; `--redis embedded` or `--redis redis-server` picks
one), and `--servers` uvicorn processes. The agents are simulated in processes of the
bench's own (`--agents-per-process`, 250 by default), on uvloop as the agent's uvicorn runs
them: each reads a round (a `gpu` and an `allocation` sample per GPU) once a second and hands
it to the agent's own `Reporter` (agent/control.py), which sends it over its websocket,
/agent/v1/samples/stream, with its host's secret exactly as a running agent does; latency
starts at the read. The viewers, in another process, are
`websockets` clients on /ws/instances/<id>/metrics/ with a member's bearer token; latency
ends when one receives.

Per run it prints: samples in, messages expected and delivered, lost, agent-read → client-
received latency (p50/p99/max), the CPU the server processes, Redis and the bench's own
processes used in the measured seconds, as cores, and how late the bench's own two event loops
ran (p99): what of a latency is the bench's.
The baseline (`bare`) is the target load with no agent, no push and no live window: a process
of the bench's own PUBLISHes each GPU's sample frame straight to its instance's Redis channel,
as the console's ingestion does, and the same servers relay it to the same viewers. No change
of ours makes that path faster, so the other runs' figures are also given as ratios to it.
`polling` is the target load watched by plain HTTP polling of the history API every second.

`--runs scaling` measures how the servers' CPU grows with the fleet: at each size of `--scale`
(GPUs, default 1,000, 5,000 and 10,000, `--gpus` to an agent, one read a second each, 500
viewers) an agents run and a bare run, then a table of samples per second per web core and
the read → browser p99 beside the bare path's.

    .venv/bin/python bench/metrics.py                        # small, target, bare, polling
    .venv/bin/python bench/metrics.py --runs scaling --seconds 10 --scale 1000,5000
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

import uvloop

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scratch import embedded_redis_process, make_run_redis  # noqa: E402 - bench/ is on the path as a script
from stats import percentile  # noqa: E402 - bench/ is on the path when run as a script

RUNS = {
    "small": {"agents": 10, "gpus": 8, "viewers": 50, "watch": "ws", "push": "agent"},
    "target": {"agents": 125, "gpus": 8, "viewers": 500, "watch": "ws", "push": "agent"},
    "bare": {"agents": 125, "gpus": 8, "viewers": 500, "watch": "ws", "push": "bare"},
    "polling": {"agents": 125, "gpus": 8, "viewers": 500, "watch": "poll", "push": "agent"},
}
SCALE_VIEWERS = 500
TARGET_GPUS, TARGET_P99_MS = 10_000, 250.0
INSTANCES_PER_TENANT = 8
# The agents (and the bare publisher) start this long before the measured seconds: 1,250
# agents connecting at once (a console restart) cost the servers ~2 s of CPU in handshake
# checks and first lookups, late by up to ~1 s for the first 3 s at 10,000 GPUs; what is
# measured is the fleet once connected.
LEAD_SECONDS = 6.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """user + system CPU of a process and its reaped children, from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / CLK_TCK


def loop_cpu_seconds(pid: int) -> float:
    """user + system CPU of a process's main thread: a server's event loop (its other threads
    take the agents' batches, console/metrics/intake.py, and the consumers' database calls)."""
    with open(f"/proc/{pid}/task/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return sum(int(fields[i]) for i in (11, 12)) / CLK_TCK


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

    from console import state_dir

    state_dir.prepare()
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

    def merge(self, other: "AgentsTally") -> None:
        self.samples_in += other.samples_in
        self.posts_failed += other.posts_failed
        self.post_seconds += other.post_seconds
        self.expected |= other.expected
        self.loop_lag += other.loop_lag


@dataclass
class ViewersTally:
    refused: int = 0
    received: dict = field(default_factory=dict)  # (instance, ts) -> received at (the first)
    duplicates: list = field(default_factory=list)  # ts of samples received more than once
    poll_seconds: list[tuple[float, float]] = field(default_factory=list)  # (at, seconds)
    loop_lag: list[tuple[float, float]] = field(default_factory=list)  # (at, lag)


def _readings(count: int = 256) -> list[dict]:
    """Readings to draw from: a simulated agent's reads cost the bench a dict copy each, not a
    draw of six random numbers (at 10,000 GPUs the bench shares the machine's two cores)."""
    found = []
    for _ in range(count):
        used = random.randint(1000, 70000)
        found.append({
            "mig_uuid": None, "gpu_util": round(random.uniform(20, 100), 1),
            "mem_used_mib": used, "mem_total_mib": 81920,
            "temperature_c": round(random.uniform(40, 80), 1),
            "power_w": round(random.uniform(80, 400), 1), "sm_clock_mhz": 1410, "ecc_errors": 0,
            "healthy": True, "processes": [{"pid": 4242, "used_mib": used}],
        })  # fmt: skip
    return found


READINGS = _readings()


def reading(ts: float, index: int, uuid: str, alloc: str | None) -> list[dict]:
    base = {**READINGS[random.randrange(len(READINGS))], "ts": ts, "gpu_index": index,
            "gpu_uuid": uuid}  # fmt: skip
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


def reporter_of(address, host):
    """The agent's own Reporter for `host`, pushing to the server at `address`."""
    from agent.control import Reporter

    identity = {"server": f"http://{address}", "host_id": host["id"], "secret": host["secret"]}
    return Reporter(None, identity, 5.0, address)


async def agent(reporter, host, watched, tally: AgentsTally, window: Window, phase):
    """A host agent's reading and pushing: a round of samples read each second and handed to
    the agent's own Reporter, which pushes it as the real agent does (at once, buffered and
    backing off while the console is away). At the end it stops reading and flushes what is
    buffered, as the agent does when it stops."""

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
        next_at = window.start - LEAD_SECONDS + phase
        while True:
            while next_at <= time.time():  # a moment this loop was too late for is skipped
                next_at += 1.0
            if next_at >= window.end:
                break
            await asyncio.sleep(next_at - time.time())
            ts = time.time()
            next_at += 1.0  # a loop that wakes a little early (uvloop's) reads once all the same
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

    tally = uvloop.run(main())  # the load generator's own cost kept low: uvloop, as uvicorn's
    conn.send(tally)


def agents_process(conn, addresses, hosts, watched, first: int, fleet: int) -> None:
    """Agents, in a process of their own: `hosts`, the fleet's from number `first` of `fleet`.
    Once they are set up (an HTTP client each: seconds for a thousand) it says "ready" and
    receives the window; they read from LEAD_SECONDS before it to its end, then flush, and the
    process sends back its tally."""

    async def main() -> AgentsTally:
        tally = AgentsTally()
        numbered = list(enumerate(hosts, start=first))
        reporters = [reporter_of(addresses[n % len(addresses)], h) for n, h in numbered]
        conn.send("ready")
        window = conn.recv()
        lags: list[tuple[float, float]] = []
        lag = asyncio.ensure_future(loop_lag(lags))
        await asyncio.gather(*[
            agent(reporter, host, watched, tally, window, phase=n / fleet)
            for reporter, (n, host) in zip(reporters, numbered, strict=True)
        ])  # fmt: skip
        lag.cancel()
        tally.loop_lag = [seconds for at, seconds in lags if at in window]
        return tally

    tally = uvloop.run(main())  # the agent's loop: uvicorn runs its Reporter on uvloop
    conn.send(tally)


def publisher_process(conn, hosts, watched) -> None:
    """The baseline's source, in a process of its own: at each host's moment of the second, one
    frame per GPU PUBLISHed in one pipeline to its instance's channel exactly as the console's
    ingestion writes it (broadcast.pubsub_wire), with no push, check or live window before.
    Says "ready", receives the window, and sends back its tally."""
    import redis

    from console import broadcast
    from console.metrics.ingest import instance_group, sample_frame

    tally = AgentsTally()
    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    client.ping()
    conn.send("ready")
    window = conn.recv()
    second = window.start - LEAD_SECONDS
    while second < window.end:
        for n, host in enumerate(hosts):
            at = second + n / len(hosts)
            if at >= window.end:
                break
            time.sleep(max(0.0, at - time.time()))
            ts = time.time()
            messages = [
                (instance_group(instance), {"type": "metrics.frames", "frames": [[ts, sample_frame(
                    instance, reading(ts, index, uuid, alloc)[-1])]]})
                for index, uuid, alloc, instance in host["gpus"]
            ]  # fmt: skip
            pipe = client.pipeline(transaction=False)
            for channel, payload in broadcast.pubsub_wire(messages):
                pipe.publish(channel, payload)
            pipe.execute()
            if ts in window:
                tally.loop_lag.append(ts - at)
                tally.samples_in += len(messages)
                tally.expected.update(
                    (instance, ts) for *_, instance in host["gpus"] if instance in watched
                )
        second += 1.0
    client.close()
    conn.send(tally)


def drive(world, servers, redis_proc, agents, viewers, watch, push, warmup, seconds, drain,
          per_process):  # fmt: skip
    """The viewers connect; then the agents (at most `per_process` to a process) or the bare
    publisher start, and `seconds` after `warmup` count: what was read in them, and the CPU
    the servers, Redis and the bench's own processes used in them (cores)."""
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
    sources = []
    if push == "bare":
        sources.append((publisher_process, (hosts, set(watched))))
    else:
        for first in range(0, len(hosts), per_process):
            part = hosts[first : first + per_process]
            sources.append((agents_process, (addresses, part, set(watched), first, len(hosts))))
    ends, procs = [], []
    for target, arguments in sources:
        end, child_end = context.Pipe()
        procs.append(context.Process(target=target, args=(child_end, *arguments)))
        procs[-1].start()
        ends.append(end)
    for end in ends:
        end.recv()  # "ready"
    window = Window(time.time() + max(warmup, LEAD_SECONDS), 0.0)
    window.end = window.start + seconds
    for end in ends:
        end.send(window)
    time.sleep(max(0.0, window.start - time.time()))
    pids = {
        "server": [proc.pid for proc, _ in servers],
        "redis": [redis_proc.pid] if redis_proc else [],
        "bench": [proc.pid for proc in [*procs, viewers_proc]],
    }
    loops_before = sum(map(loop_cpu_seconds, pids["server"]))
    cpu_before = {part: sum(map(cpu_seconds, found)) for part, found in pids.items()}
    wall_before = time.monotonic()
    time.sleep(max(0.0, window.end - time.time()))
    cpu_after = {part: sum(map(cpu_seconds, found)) for part, found in pids.items()}
    loops_after = sum(map(loop_cpu_seconds, pids["server"]))
    wall = time.monotonic() - wall_before
    cpu = {part: (cpu_after[part] - cpu_before[part]) / wall for part in pids}
    cpu["server_loops"] = (loops_after - loops_before) / wall
    cpu["redis"] = cpu["redis"] if redis_proc else None
    agents_tally = AgentsTally()
    for end, proc in zip(ends, procs, strict=True):
        agents_tally.merge(end.recv())
        proc.join()
    time.sleep(drain)
    viewers_end.send("stop")
    viewers_tally = viewers_end.recv()
    viewers_proc.join()
    return window, agents_tally, viewers_tally, cpu, wall


def run(name, world, work, redis_proc, args, agents, gpus, viewers, watch, push) -> dict:
    import redis as redis_client

    redis_client.Redis.from_url(os.environ["REDIS_URL"]).flushdb()
    servers = start_servers(args.servers, work)
    try:
        window, sent, seen, cpu, wall = drive(
            world,
            servers,
            redis_proc,
            agents,
            viewers,
            watch,
            push,
            args.warmup,
            args.seconds,
            args.drain,
            args.agents_per_process,
        )
    finally:
        for proc, _ in servers:
            stop(proc)
    try:
        redis_memory = redis_client.Redis.from_url(os.environ["REDIS_URL"]).info("memory")[
            "used_memory"
        ]
    except Exception:  # fakeredis answers INFO partly
        redis_memory = None
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
        "push": push,
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
        "server_cpu": cpu["server"],
        "server_loops_cpu": cpu["server_loops"],
        "redis_cpu": cpu["redis"],
        "bench_cpu": cpu["bench"],
        "seconds": wall,
        "load": os.getloadavg()[0],
        "redis_memory_mib": redis_memory / 2**20 if redis_memory else None,
    }


def table(results: list[dict], redis: str) -> str:
    head = (
        "| run | push | watch | GPUs (agents x G) | viewers | servers | samples in (/s) "
        "| msgs expected "
        "| delivered | lost | p50 ms | p99 ms | max ms | server CPU (cores): all (event loops) "
        "| Redis CPU "
        "| bench CPU | bench loops' lag p99 ms (agents, viewers) | load avg |"
    )
    lines = [head, "|" + "---|" * 18]
    for r in results:
        redis_cpu = f"{r['redis_cpu']:.2f}" if r["redis_cpu"] is not None else "n/a"
        lines.append(
            f"| {r['run']} | {r['push']} | {r['watch']} "
            f"| {r['gpus']} ({r['agents']} x {r['gpus'] // r['agents']}) "
            f"| {r['viewers']} | {r['servers']} "
            f"| {r['samples_in']} ({r['samples_per_s']:.0f}) "
            f"| {r['expected']} | {r['delivered']} | {r['lost']} | {r['p50_ms']:.1f} "
            f"| {r['p99_ms']:.1f} | {r['max_ms']:.1f} "
            f"| {r['server_cpu']:.2f} ({r['server_loops_cpu']:.2f}) | {redis_cpu} "
            f"| {r['bench_cpu']:.2f} "
            f"| {r['agents_lag_p99_ms']:.0f}, {r['viewers_lag_p99_ms']:.0f} | {r['load']:.1f} |"
        )
    lines.append(
        f"\nRedis: {redis}. CPU in cores (1.00 = one core busy) over the measured window, the "
        f"servers' event loops (their main threads) apart; "
        f"load avg: the machine's 1-minute load average after the run ({os.cpu_count()} CPUs)."
    )
    return "\n".join(lines)


def _ratio(value: float, base: float) -> str:
    """value ÷ base as "2.3×"; "–" where the base measured nothing (a run too short for the
    servers' CPU clock to move)."""
    return f"{value / base:.1f}×" if base else "–"


def scaling_table(results: list[dict]) -> str:
    """Each websocket run of the agents beside the bare run of the same fleet, if any: the
    servers' samples per second per core, the p99, and both as ratios to the bare path's."""
    bare = {(r["gpus"], r["viewers"]): r for r in results if r["push"] == "bare"}
    lines = [
        "| GPUs | samples in /s | web CPU (cores) | samples/s per web core | lost | p99 ms "
        "| bare: frames/s, web CPU (cores), p99 ms | web CPU ÷ bare's | p99 ÷ bare's |",
        "|" + "---|" * 9,
    ]
    for r in results:
        if r["push"] != "agent" or r["watch"] != "ws":
            continue
        per_core = r["samples_per_s"] / r["server_cpu"] if r["server_cpu"] else float("nan")
        base = bare.get((r["gpus"], r["viewers"]))
        if base:
            against = (
                f"{base['samples_per_s']:.0f}, {base['server_cpu']:.2f}, {base['p99_ms']:.1f} "
                f"| {_ratio(r['server_cpu'], base['server_cpu'])} "
                f"| {_ratio(r['p99_ms'], base['p99_ms'])}"
            )
        else:
            against = "not run | – | –"
        lines.append(
            f"| {r['gpus']} | {r['samples_per_s']:.0f} | {r['server_cpu']:.2f} | {per_core:.0f} "
            f"| {r['lost']} | {r['p99_ms']:.1f} | {against} |"
        )
    return "\n".join(lines)


def scaling_verdict(results: list[dict]) -> str:
    """The target of 10,000 GPUs at one sample a second on this machine: met, missed, or not
    measured (then the largest fleet measured)."""
    runs = [r for r in results if r["push"] == "agent" and r["watch"] == "ws"]
    at_target = [r for r in runs if r["gpus"] >= TARGET_GPUS]
    head = f"target: {TARGET_GPUS:,} GPUs with p99 < {TARGET_P99_MS:.0f} ms, nothing lost: "
    if not at_target:
        largest = max((r["gpus"] for r in runs), default=0)
        return head + f"not measured in this run (largest fleet: {largest:,} GPUs)"
    worst = max(at_target, key=lambda r: r["p99_ms"])
    met = all(r["p99_ms"] < TARGET_P99_MS and r["lost"] == 0 for r in at_target)
    return head + f"{'met' if met else 'MISSED'} (p99 {worst['p99_ms']:.1f} ms)"


def planned_runs(names: list[str], args) -> list[tuple[str, dict]]:
    """The runs the names stand for, in order: `scaling` is an agents run and a bare run at
    each size of args.scale."""
    runs = []
    for name in names:
        if name == "custom":
            spec = {"agents": args.agents, "gpus": args.gpus, "viewers": args.viewers}
            runs.append((name, {**spec, "watch": args.watch, "push": "agent"}))
        elif name == "scaling":
            for size in args.scale:
                agents = max(1, size // args.gpus)
                viewers = min(SCALE_VIEWERS, agents * args.gpus)
                spec = {"agents": agents, "gpus": args.gpus, "viewers": viewers, "watch": "ws"}
                for push in ("agent", "bare"):
                    runs.append((f"{push}-{size}", {**spec, "push": push}))
        elif name in RUNS:
            runs.append((name, RUNS[name]))
        else:
            raise ValueError(f"unknown run {name!r}")
    return runs


def sizes(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("comma-separated numbers of GPUs") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("comma-separated numbers of GPUs, each at least 1")
    return values


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="small,target,bare,polling",
                        help=f"comma-separated: {', '.join(RUNS)}, custom, scaling")  # fmt: skip
    parser.add_argument("--scale", type=sizes, default=[1000, 5000, 10000],
                        help="scaling: fleet sizes in GPUs (default 1000,5000,10000)")  # fmt: skip
    parser.add_argument("--agents", type=int, default=20, help="custom run: agents")
    parser.add_argument("--gpus", type=int, default=8, help="custom run: GPUs per agent")
    parser.add_argument("--viewers", type=int, default=100, help="custom run: viewers")
    parser.add_argument("--watch", choices=["ws", "poll"], default="ws", help="custom run")
    parser.add_argument("--servers", type=int, default=2, help="uvicorn processes")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per run")
    parser.add_argument(
        "--warmup", type=float, default=6.0,
        help="seconds before the measured ones, from when the agents are set up: their first "
        "pushes open connections",
    )  # fmt: skip
    parser.add_argument(
        "--agents-per-process", type=int, default=250,
        help="simulated agents to a process: one event loop pushes ~250 agents' rounds on time",
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
    if args.agents_per_process < 1:
        parser.error("--agents-per-process: at least 1")
    try:
        runs = planned_runs(names, args)
    except ValueError as error:
        parser.error(str(error))
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
                         spec["viewers"], spec["watch"], spec["push"])  # fmt: skip
            results.append(result)
            print(json.dumps(result), flush=True)
        print()
        print(table(results, redis_kind))
        print()
        print("Per web core, and against the bare Redis publish → websocket path of one fleet:")
        print()
        print(scaling_table(results))
        print()
        print(scaling_verdict(results))
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
