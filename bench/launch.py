"""Launch latency: REST API launch → `running`, and the workload's own exit → `stopped`, with
the real stack, for each workload runtime side by side.

Starts, in a throwaway directory: the Redis `make run` would (bench/scratch.py), a
SQLite database (migrated here, with a minimal catalog), uvicorn, a Celery worker and, per
runtime, one simulated host agent in a region of its own that registers with a join token:
`process` (a process per instance) and `oci` (a Podman container per instance, the image
present: a warm start), and a few oci cold starts, whose image (a 32 MB layer of its own) is
pulled from Debian's docker-registry on loopback where it is installed. Each
instance runs `sleep 3` and so exits by itself. Times: launch until `running` arrives on the
tenant's /ws/events/ socket; the workload's exit (the time the agent saw it) until `stopped`
arrives there. Each launch's time is split into the API's answer, the queue wait (placed →
its provision task starts), the task's agent calls and the state change (the agent's answer →
`running` on the socket), from its events and the worker's notes (bench/timed_worker.py).
The web and worker processes are `make run`'s. The CPU time each spent per launch (its exit
included: robust to other load, unlike the times), the agents', Redis's and
Podman's service's beside them, and the rest of the machine's (runc, conmon, networking, and
whatever else runs). The baseline, measured in the same run, is one bare agent round trip:
`PUT /v1/allocations/{id}` straight to the agent.

    .venv/bin/python bench/launch.py                 # 24 instances a runtime, 4 in flight
    .venv/bin/python bench/launch.py -n 60 -c 8 --gpus 16 --runtimes oci
    .venv/bin/python bench/launch.py -n 48 -c 16 --burst   # bursts of 16 launches at once
    DATABASE_URL=postgres://… .venv/bin/python bench/launch.py   # on PostgreSQL instead
"""

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scratch import make_run_redis, scratch_var_dir  # noqa: E402 - bench/ is on the path as a script
from stats import percentile  # noqa: E402 - bench/ is on the path when run as a script


def row(name: str, values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return (
        f"| {name:<40} | {len(ms):>4} | {percentile(ms, 50):>8.1f} | {percentile(ms, 99):>8.1f} "
        f"| {max(ms):>8.1f} | {statistics.fmean(ms):>8.1f} |"
    )


class Started:
    """A process started elsewhere (the Podman service), stopped as the bench's others are."""

    def __init__(self, name: str, popen):
        self.name = name
        self.popen = popen
        self.pid = popen.pid

    def stop(self) -> None:
        self.popen.terminate()
        self.popen.wait(10)


def _cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of the process `pid` and its living descendants."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    used: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
        used[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    tree, todo = set(), [pid]
    while todo:
        current = todo.pop()
        tree.add(current)
        todo.extend(child for child, parent in parents.items() if parent == current)
    return sum(used.get(p, 0.0) for p in tree)


def _machine_cpu_seconds() -> float:
    """CPU time the whole machine spent busy (every process, the kernel's work included)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def cpu_line(label: str, cpu: dict[str, float]) -> str:
    rest = cpu["machine"] - sum(v for k, v in cpu.items() if k != "machine")
    return (
        f"{label}: web {cpu['web'] * 1000:.0f} ms, worker {cpu['worker'] * 1000:.0f} ms, "
        f"agents {cpu['agent'] * 1000:.0f} ms, Redis {cpu['redis'] * 1000:.0f} ms, "
        f"Podman's service {cpu['engine'] * 1000:.0f} ms, the rest (conmon, runc, networking, "
        f"this bench, other load) {rest * 1000:.0f} ms; the machine {cpu['machine'] * 1000:.0f} ms"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--instances", type=int, default=24)
    parser.add_argument("-c", "--concurrency", type=int, default=4, help="launches in flight")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs of the simulated host")
    parser.add_argument(
        "--workers", type=int, help="Celery worker processes (default: what make run starts)"
    )
    parser.add_argument(
        "--burst",
        action="store_true",
        help="launch in bursts of --concurrency at once, each after the one before has stopped",
    )
    parser.add_argument("--warmup", type=int, default=2, help="launches not counted, first")
    parser.add_argument("--baseline-rounds", type=int, default=20)
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs)")
    parser.add_argument(
        "--cold",
        type=int,
        default=3,
        help="oci cold starts (image pulled from a loopback registry; needs docker-registry)",
    )
    parser.add_argument(
        "--runtimes",
        default="process,oci",
        help="comma-separated workload runtimes to measure (oci needs podman)",
    )
    args = parser.parse_args()

    tmp = scratch_var_dir("gpucloud-bench-")
    os.environ.setdefault("DATABASE_URL", "")

    redis_url, redis_proc, args.redis_kind = make_run_redis(tmp)
    os.environ["REDIS_URL"] = redis_url

    import django

    from console import state_dir

    state_dir.prepare()
    django.setup()

    procs: list = [Started("redis", redis_proc)]
    try:
        return run(args, tmp, procs)
    finally:
        for proc in reversed(procs):
            proc.stop()
        if args.keep:
            print(f"logs in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def run(args, tmp: Path, procs: list) -> int:
    from decimal import Decimal

    import httpx
    from django.core.management import call_command
    from django.db import connection
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    from accounts import services as accounts
    from accounts.roles import Role
    from agent.devtools import engine
    from agent.podman import podman_command, podman_env
    from console import processes
    from console.catalog.models import GpuModel, Image, MigProfile, Mode, Region, Spec
    from console.fleet import agent_client
    from console.fleet import services as fleet
    from console.fleet.models import Host
    from console.instances.models import Instance, InstanceEvent
    from tests.harness import Proc

    runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    call_command("migrate", verbosity=0)
    a100 = GpuModel.objects.create(
        code="a100-80gb", name="NVIDIA A100 80GB", memory_mib=81920, mig_capable=True
    )
    mig = MigProfile.objects.create(
        gpu_model=a100, name="1g.10gb", compute_slices=1, size=1,
        starts=[0, 1, 2, 3, 4, 5, 6], memory_mib=9728,
    )  # fmt: skip
    common = {"gpu_model": a100, "vcpus": 1, "ram_mib": 256, "disk_gib": 1}
    specs = [
        Spec.objects.create(code="a100-quarter", name="A100 1/4", mode=Mode.SHARED, milli=250,
                            gpu_memory_mib=20480, price_per_hour=Decimal("0.9"), **common),
        Spec.objects.create(code="a100-1g10gb", name="A100 1g.10gb", mode=Mode.MIG,
                            mig_profile=mig, gpu_memory_mib=9728,
                            price_per_hour=Decimal("0.5"), **common),
    ]  # fmt: skip
    image = Image.objects.create(
        name="demo-busybox", reference=engine.DEMO_IMAGE, cuda_version="-", command=[]
    )
    tenant = accounts.create_tenant("bench", gpu_quota="1000", max_instances=10_000)
    user = accounts.ensure_user("bench")
    accounts.add_member(tenant, user, Role.MEMBER)
    token = accounts.issue_token(user, tenant, "bench").raw

    env = processes.child_env()
    port = processes.free_port()
    url = f"http://127.0.0.1:{port}"
    web = Proc("web", processes.web_cmd(port, workers=processes.web_workers()), env, tmp)
    procs.append(web)
    # make run's worker, which also notes each provision task's times (bench/timed_worker.py)
    timings = tmp / "timings.jsonl"
    args.workers = args.workers or processes.worker_concurrency()
    worker = processes.worker_cmd(concurrency=args.workers)
    timed = [processes.PYTHON, str(ROOT / "bench" / "timed_worker.py"), *worker[3:]]
    procs.append(Proc("worker", timed, {**env, "BENCH_TIMINGS": str(timings)}, tmp))
    processes.wait_http(f"{url}/healthz", proc=web.popen)
    procs[-1].wait_for_log("ready.", timeout=60)
    engine_url = registry = None
    if "oci" in runtimes:
        registries = tmp / "registries.conf"
        if shutil.which("docker-registry") and args.cold:
            from tests.registry import start_registry

            registry = f"127.0.0.1:{processes.free_port()}"
            procs.append(Started("registry", start_registry(tmp / "registry", registry)))
            registries.write_text(f'[[registry]]\nlocation = "{registry}"\ninsecure = true\n')
        else:
            registries.write_text("")
        os.environ["CONTAINERS_REGISTRIES_CONF"] = str(registries)
        procs.append(
            Started(
                "engine",
                engine.start_podman_service(
                    tmp / "podman.sock",
                    tmp / "podman.log",
                    CONTAINERS_REGISTRIES_CONF=str(registries),
                ),
            )
        )
        engine.build_demo_image()
        engine_url = f"unix://{tmp / 'podman.sock'}"

    shared = (args.gpus + 1) // 2
    modes = ",".join(["shared"] * shared + ["mig"] * (args.gpus - shared))
    at_once = args.concurrency if args.burst else args.instances  # a burst's slices come back
    wanted = [abs(i) % len(specs) for i in [*range(at_once), *range(-args.warmup, 0)]]
    if wanted.count(0) > shared * 4 or wanted.count(1) > (args.gpus - shared) * 7:
        print(f"{args.gpus} GPUs ({modes}) cannot hold them all; use more --gpus")
        return 2

    def start_host(runtime: str) -> Host:
        region = Region.objects.create(code=f"{runtime}-1", name=f"{runtime} hosts")
        _, raw = fleet.create_join_token(region)
        agent_port = processes.free_port()
        cmd = processes.agent_cmd(
            url, tmp / f"agent-{runtime}", f"127.0.0.1:{agent_port}", join_token=raw,
            hostname=f"bench-{runtime}", region=region.code, gpus=args.gpus, model="a100-80gb",
            mode=modes, runtime=runtime, engine_url=engine_url,
        )  # fmt: skip
        procs.append(Proc(f"agent-{runtime}", cmd, env, tmp))
        deadline = time.monotonic() + 60
        while not Host.objects.filter(name=f"bench-{runtime}", status="active").exists():
            if time.monotonic() > deadline:
                raise TimeoutError(procs[-1].log()[-2000:])
            time.sleep(0.1)
        host = Host.objects.get(name=f"bench-{runtime}")
        while host.gpus.count() < args.gpus:
            time.sleep(0.1)
        host.refresh_from_db()
        processes.wait_http(f"http://127.0.0.1:{agent_port}/v1/healthz")
        return host

    hosts = {runtime: start_host(runtime) for runtime in runtimes}
    host = hosts[runtimes[0]]

    # baseline: one bare agent PUT round trip, from this process: through agent_client (what
    # the tasks do) and over a kept-alive HTTP connection (the agent's own cost)
    baseline, raw_http = [], []
    body = {"mode": "shared", "gpus": [0], "shared": {"milli": 125, "memory_mib": 1024},
            "mig": None, "image": engine.DEMO_IMAGE, "command": ["sleep", "60"],
            "labels": {"bench": "baseline"}}  # fmt: skip
    for i in range(args.baseline_rounds):
        started = time.perf_counter()
        agent_client.create_allocation(host, f"baseline-{i}", body)
        baseline.append(time.perf_counter() - started)
        agent_client.delete_allocation(host, f"baseline-{i}")
        agent_client.delete_instance_data(host, f"baseline-{i}")  # and its volume
    with httpx.Client(
        base_url=host.address, headers={"Authorization": f"Bearer {host.secret}"}, timeout=30
    ) as agent:
        for i in range(args.baseline_rounds):
            started = time.perf_counter()
            agent.put(f"/v1/allocations/raw-{i}", json=body).raise_for_status()
            raw_http.append(time.perf_counter() - started)
            agent.delete(f"/v1/allocations/raw-{i}")
            agent.delete(f"/v1/instances/raw-{i}")

    # listen for state changes before launching anything: (instance, state) → first seen
    seen_at: dict[tuple[int, str], float] = {}
    ready = threading.Event()

    def listen():
        with (
            contextlib.suppress(ConnectionClosed),
            connect(
                f"ws://127.0.0.1:{port}/ws/events/",
                additional_headers={"Authorization": f"Bearer {token}"},
                origin=url,
            ) as socket,
        ):
            ready.set()
            for text in socket:
                message = json.loads(text)
                if message.get("type") == "instance.state":
                    key = (message["instance"]["id"], message["instance"]["state"])
                    seen_at.setdefault(key, time.perf_counter())

    threading.Thread(target=listen, daemon=True).start()
    if not ready.wait(10):
        raise TimeoutError("the /ws/events/ socket did not open")
    # Idle connections are dropped before uvicorn's keep-alive (5 s) would close them: a burst
    # comes after the last one's workloads stopped, and a POST on a connection the server was
    # closing meanwhile failed the bench ("Server disconnected without sending a response").
    client = httpx.Client(base_url=f"{url}/api/v1", headers={"Authorization": f"Bearer {token}"},
                          timeout=30, limits=httpx.Limits(keepalive_expiry=2))  # fmt: skip
    # perf_counter and the wall clock side by side, to place the agent's exit times
    offset = time.time() - time.perf_counter()

    def measure(runtime: str) -> dict[str, list[float]]:
        launched: dict[int, float] = {}
        api_times: list[float] = []

        def launch(i: int):
            spec = specs[abs(i) % len(specs)]
            started = time.perf_counter()
            response = client.post("/instances/", json={
                "name": f"{runtime}-{i}" if i >= 0 else f"{runtime}-warm{-i}",
                "spec": spec.code, "image": image.name, "region": f"{runtime}-1",
                "command": ["sleep", "3"],
            })  # fmt: skip
            api_times.append(time.perf_counter() - started)
            response.raise_for_status()
            launched[response.json()["id"]] = started

        def wait_all(ids, state: str, seconds: float) -> None:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline and any((i, state) not in seen_at for i in ids):
                time.sleep(0.05)

        # warm-up, not counted: the first request of each process connects to the broker and
        # the database, the first task of each worker process imports what it lazily needs
        for i in range(args.warmup):
            launch(-1 - i)
        wait_all(list(launched), "stopped", 60)
        launched.clear()
        api_times.clear()
        cpu_before = cpu_now()
        with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
            if not args.burst:
                list(pool.map(launch, range(args.instances)))
            launching = dict.fromkeys(cpu_before, 0.0)  # a burst's, until all run
            for first in range(0, args.instances if args.burst else 0, args.concurrency):
                burst_before = cpu_now()
                list(pool.map(launch, range(first, min(first + args.concurrency, args.instances))))
                wait_all(list(launched), "running", 60)
                for name, after in cpu_now().items():
                    launching[name] += after - burst_before[name]
                wait_all(list(launched), "stopped", 120)
        wait_all(list(launched), "stopped", 120)
        cpu = {name: (after - cpu_before[name]) / max(len(launched), 1)
               for name, after in cpu_now().items()}  # fmt: skip
        cpu_launching = (
            {name: used / max(len(launched), 1) for name, used in launching.items()}
            if args.burst
            else None
        )
        running = [
            seen_at[(i, "running")] - t for i, t in launched.items() if (i, "running") in seen_at
        ]
        exits = InstanceEvent.objects.filter(instance_id__in=launched, to_state="stopping")
        stopped = [
            seen_at[(pk, "stopped")] + offset - at.timestamp()
            for pk, at in exits.values_list("instance_id", "at")
            if (pk, "stopped") in seen_at
        ]
        return {"api": api_times, "running": running, "stopped": stopped, "cpu": cpu,
                "cpu_launching": cpu_launching,
                **breakdown(list(launched))}  # fmt: skip

    def cpu_now() -> dict[str, float]:
        """CPU seconds so far of the web, the worker, the agents, the embedded Redis and
        Podman's service (each with its child processes), and of the whole machine."""
        mine = {proc.name: _cpu_seconds(proc.pid) for proc in procs}
        return {"web": mine["web"], "worker": mine["worker"],
                "agent": sum(v for k, v in mine.items() if k.startswith("agent-")),
                "redis": mine["redis"], "engine": mine.get("engine", 0.0),
                "machine": _machine_cpu_seconds()}  # fmt: skip

    def breakdown(ids) -> dict:
        """Where each launch's time went, from its events and the worker's notes
        (bench/timed_worker.py): placed (its `provisioning` event, committed as its task is
        queued) → its provision task starts (queue wait); the task's agent calls; the rest of
        its task runs, retries included; the last agent call's answer → `running` on the
        socket (state change: the commit and the broadcast, or the agent's later event)."""
        runs: dict[int, list[dict]] = {}
        for line in timings.read_text().splitlines() if timings.exists() else []:
            run = json.loads(line)
            runs.setdefault(run["instance"], []).append(run)
        placed = InstanceEvent.objects.filter(instance_id__in=ids, to_state="provisioning")
        parts: dict[str, list[float]] = {"queue": [], "agent": [], "task": [], "change": []}
        for pk, at in placed.values_list("instance_id", "at"):
            if pk not in runs or (pk, "running") not in seen_at:
                continue
            calls = [call for run in runs[pk] for call in run.get("calls", [])]
            first = min(run["started"] for run in runs[pk])
            last_call = max((call[2] for call in calls), default=first)
            agent = sum(end - start for _, start, end in calls)
            parts["queue"].append(first - at.timestamp())
            parts["agent"].append(agent)
            parts["task"].append(last_call - first - agent)
            parts["change"].append(seen_at[(pk, "running")] + offset - last_call)
        return parts

    results = {runtime: measure(runtime) for runtime in runtimes}

    def cold_start(i: int) -> float:
        """Launch → running of an image the host lacks: its own 32 MB layer is pulled from
        the loopback registry (the base layers are the demo image's, already there)."""
        reference = f"{registry}/gpucloud/cold-{i}:{os.getpid()}"
        context = tmp / f"cold-{i}"
        context.mkdir()
        (context / "blob").write_bytes(os.urandom(32 * 1024 * 1024))
        (context / "Containerfile").write_text(f"FROM {engine.DEMO_IMAGE}\nCOPY blob /blob\n")
        for step in (["build", "-q", "-t", reference, str(context)], ["push", reference],
                     ["rmi", reference]):  # fmt: skip
            subprocess.run(podman_command(None, *step), env=os.environ | podman_env(),
                           check=True, capture_output=True)  # fmt: skip
        cold_image = Image.objects.create(name=f"cold-{i}", reference=reference, cuda_version="-")
        started = time.perf_counter()
        response = client.post("/instances/", json={
            "name": f"cold-{i}", "spec": specs[0].code, "image": cold_image.name,
            "region": "oci-1", "command": ["sleep", "1"],
        })  # fmt: skip
        response.raise_for_status()
        key = (response.json()["id"], "running")
        deadline = time.monotonic() + 120
        while key not in seen_at and time.monotonic() < deadline:
            time.sleep(0.02)
        return seen_at[key] - started

    cold = [cold_start(i) for i in range(args.cold)] if registry else []
    for pk in Instance.objects.values_list("pk", flat=True):  # their containers and volumes go
        client.post(f"/instances/{pk}/terminate/")
    deadline = time.monotonic() + 120
    while Instance.objects.exclude(state="terminated").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    for image in Image.objects.filter(name__startswith="cold-"):  # leave the host as it was
        subprocess.run(podman_command(None, "rmi", "-f", image.reference),
                       env=os.environ | podman_env(), capture_output=True)  # fmt: skip

    print()
    codes = ", ".join(s.code for s in specs)
    flight = (
        f"in bursts of {args.concurrency} at once"
        if args.burst
        else f"{args.concurrency} in flight"
    )
    print(
        f"gpucloud launch bench: {args.instances} instances a runtime ({codes} alternating), "
        f"{flight}, a simulated host with {args.gpus} GPUs ({modes}) per "
        f"runtime, {connection.vendor}, {args.redis_kind}, uvicorn ({processes.web_workers()} "
        f"processes) + 1 Celery worker ({args.workers} processes), {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.1f}"
    )
    print()
    print(f"| {'what':<40} |    n |  p50 ms  |  p99 ms  |  max ms  | mean ms  |")
    print(f"|{'-' * 42}|------|----------|----------|----------|----------|")
    print(row(f"bare agent PUT ({runtimes[0]}), kept-alive", raw_http))
    print(row(f"bare agent PUT ({runtimes[0]}), agent_client", baseline))
    for runtime, got in results.items():
        print(row(f"{runtime}: POST /api/v1/instances/", got["api"]))
        print(row(f"{runtime}: launch → running (ws)", got["running"]))
        print(row(f"{runtime}:   queue wait (placed → task)", got["queue"]))
        print(row(f"{runtime}:   agent calls (keys, PUT)", got["agent"]))
        print(row(f"{runtime}:   rest of the task (retries)", got["task"]))
        print(row(f"{runtime}:   state change (→ ws running)", got["change"]))
        print(row(f"{runtime}: exit → stopped (ws)", got["stopped"]))
    if cold:
        print(row("oci: cold launch → running (pull)", cold))
    print()
    for runtime, got in results.items():
        for what, cpu in (
            ("its exit included", got["cpu"]),
            ("until running", got["cpu_launching"]),
        ):
            if cpu is not None:
                print(cpu_line(f"{runtime}: CPU per launch ({what})", cpu))
    print()
    complete = True
    for runtime, got in results.items():
        launch_ok = percentile(got["running"], 99) < 2
        exit_ok = percentile(got["stopped"], 99) < 2
        complete &= len(got["running"]) == len(got["stopped"]) == args.instances
        print(
            f"{runtime}: {len(got['running'])}/{args.instances} running, "
            f"{len(got['stopped'])} stopped by themselves; target launch p99 < 2000 ms: "
            f"{'met' if launch_ok else 'MISSED'}; exit → stopped p99 < 2000 ms: "
            f"{'met' if exit_ok else 'MISSED'}"
        )
    return 0 if complete else 1


if __name__ == "__main__":
    sys.exit(main())
