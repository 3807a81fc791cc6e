"""Placement quality and speed on the Alibaba GPU-sharing trace (../shared/traces/README.md).

Every host of the node list comes in with all its GPUs in shared mode; requests arrive one by
one in creation_time order (file order where the list has no creation_time) and nothing
departs; each is placed by console.scheduler.policies.place and applied, or rejected. When
the file runs out before the arrived GPU demand reaches the cluster's capacity, requests
keep arriving, drawn from the same file at random (--seed). At the moment the arrived demand
reaches 100% of capacity: GPUs allocated (milli allocated / 1000) and the unallocated share.

Trace requests map to gpucloud requests as: num_gpu 0 -> vCPU and RAM only; num_gpu 1 and
gpu_milli < 1000 -> a shared fraction; otherwise num_gpu whole GPUs, each shared GPU at 1000
milli (so nobody else holds any of it). The trace has no GPU memory: fractions carry no
memory cap, so GPU memory never binds (GPUs are given TRACE_GPU_MEMORY_MIB for the record).

    .venv/bin/python bench/scheduler.py --nodes ../shared/traces/openb_node_list_gpu_node.csv \\
        --pods ../shared/traces/openb_pod_list_default.csv [--json] [--policies fgd] [--seed 1] \\
        [--repeat 3]

A workload with more distinct fractions (the scheduler's cost must not grow with them):
--fractions gives each fractional request of the file one of eleven sizes (FRACTIONS)
instead, drawn at random (--seed), or one of those listed (--fractions 100,125,333); the
hosts stay the same. The file's own fractions are replayed too, in the same run, as the
baseline: the table states the mix's decisions per CPU-second as a ratio to the file's
(target: at least 0.5, placement cost within 2x whatever the mix).

decisions_per_s and decisions_per_cpu_s count place() and apply() together, in wall-clock
and in CPU time (the CPU figure does not move with what else the machine runs). Each
policy's unallocated share is also stated as a ratio to best-fit's on the same workload.
"""

import argparse
import csv
import functools
import heapq
import itertools
import json
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.stats import percentile  # noqa: E402
from console.scheduler.cluster import Cluster  # noqa: E402
from console.scheduler.model import MILLI, SHARED, Gpu, Node, Placement, Request  # noqa: E402
from console.scheduler.policies import POLICIES, place  # noqa: E402

TRACES = ROOT.parent / "shared" / "traces"
TRACE_GPU_MEMORY_MIB = 16384
# the mix of --fractions: eleven sizes, from an eighth to four fifths of a GPU
FRACTIONS = [100, 125, 200, 250, 300, 333, 460, 500, 600, 750, 810]
REGION = "trace"


def read_hosts(path: Path) -> list[Node]:
    with path.open(newline="") as f:
        return [
            Node(
                id=row["sn"],
                region=REGION,
                schedulable=True,
                free_cpu_milli=int(row["cpu_milli"]),
                free_ram_mib=int(row["memory_mib"]),
                gpus=[
                    Gpu(index=i, model=row["model"], mode=SHARED, memory_mib=TRACE_GPU_MEMORY_MIB)
                    for i in range(int(row["gpu"]))
                ],
            )
            for row in csv.DictReader(f)
        ]


def to_request(row: dict) -> Request:
    count, milli = int(row["num_gpu"]), int(row["gpu_milli"])
    spec = row.get("gpu_spec") or ""
    return Request(
        SHARED,
        models=frozenset(m for m in spec.split("|") if m),
        gpu_count=count,
        milli=milli if count == 1 and milli < MILLI else MILLI if count else 0,
        cpu_milli=int(row["cpu_milli"]),
        ram_mib=int(row["memory_mib"]),
    )


def read_rows(path: Path, fractions: list[int] | None = None, seed: int = 1) -> list[dict]:
    """The file's rows in arrival order; with `fractions`, each fractional request asks for
    one of them instead, drawn at random (`seed`)."""
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if fractions:
        draw = random.Random(seed)
        for row in rows:
            if int(row["num_gpu"]) == 1 and int(row["gpu_milli"]) < MILLI:
                row["gpu_milli"] = str(draw.choice(fractions))
    if rows and "creation_time" in rows[0]:
        rows.sort(key=lambda row: int(row["creation_time"]))
    return rows


def demand_of(row: dict) -> int:
    return int(row["num_gpu"]) * int(row["gpu_milli"])


def read_requests(
    path: Path, fractions: list[int] | None = None, seed: int = 1
) -> list[tuple[Request, int]]:
    """(request, GPU demand in milli) in arrival order (read_rows)."""
    return [(to_request(row), demand_of(row)) for row in read_rows(path, fractions, seed)]


def arrivals(
    requests: list[tuple[Request, int]], capacity: int, seed: int
) -> Iterator[tuple[Request, int]]:
    """The file, then random draws from it, until the arrived demand reaches `capacity`."""
    draw = random.Random(seed)
    demand = 0
    for i in itertools.count():
        request = requests[i] if i < len(requests) else draw.choice(requests)
        demand += request[1]
        yield request
        if demand >= capacity:
            return


def replay(
    nodes: Path, pods: Path, policy: str, seed: int, fractions: list[int] | None = None
) -> dict:
    started = time.perf_counter()
    cluster = Cluster(read_hosts(nodes))
    capacity = MILLI * sum(len(host.gpus) for host in cluster.hosts.values())
    requests = read_requests(pods, fractions, seed)
    allocated = placed = processed = 0
    deciding = deciding_cpu = 0.0
    for request, demand in arrivals(requests, capacity, seed):
        tick, tick_cpu = time.perf_counter(), time.process_time()
        placement = place(request, cluster, policy)
        if placement is not None:
            cluster.apply(placement)
        deciding += time.perf_counter() - tick
        deciding_cpu += time.process_time() - tick_cpu
        processed += 1
        if placement is not None:
            placed += 1
            allocated += demand
    return {
        "allocated_gpus": allocated / MILLI,
        "unallocated_share": 1 - allocated / capacity,
        "decisions_per_s": processed / deciding,
        "decisions_per_cpu_s": processed / deciding_cpu,
        "capacity_gpus": capacity / MILLI,
        "requests": processed,
        "rejected": processed - placed,
        "wall_s": time.perf_counter() - started,
    }


def fastest(times: int, *args) -> dict:
    """The replay with the most decisions per CPU-second of `times` alike."""
    runs = [replay(*args) for _ in range(max(1, times))]
    return max(runs, key=lambda r: r["decisions_per_cpu_s"])


@dataclass
class Job:
    """A request of the dynamic replay: when it arrives, how long it runs once started."""

    arrival: int
    duration: int
    request: Request
    demand: int
    started: int | None = None
    placement: Placement | None = None


def read_jobs(path: Path, fractions: list[int] | None, seed: int) -> list[Job]:
    rows = read_rows(path, fractions, seed)
    if not rows or "deletion_time" not in rows[0]:
        raise SystemExit(f"{path.name} has no creation_time and deletion_time: no --dynamic")
    return [
        Job(
            arrival=int(row["creation_time"]),
            duration=int(row["deletion_time"]) - int(row["creation_time"]),
            request=to_request(row),
            demand=demand_of(row),
        )
        for row in rows
    ]


def stream(jobs: list[Job], capacity: int, load: float, count: int, seed: int) -> list[Job]:
    """`count` arrivals, evenly spaced: the file's requests in order, then drawn from it at
    random (`seed`), each with its own duration. The spacing makes the GPU time asked for
    within the arrivals' span (a request's duration counted up to the span) `load` times
    the cluster's: the trace's own arrivals, spread over months, keep a 6,212-GPU cluster at
    a few tens of GPUs, and its longest requests (months) would count for everything."""
    draw = random.Random(seed)
    picked = [jobs[i] if i < len(jobs) else draw.choice(jobs) for i in range(count)]
    gap = 1.0
    for _ in range(50):  # the span depends on the spacing: to a fixed point
        span = gap * count
        asked = sum(job.demand * min(job.duration, span) for job in picked)
        gap = asked / (load * capacity * count)
    return [
        Job(round(k * gap), job.duration, job.request, job.demand) for k, job in enumerate(picked)
    ]


def dynamic(
    nodes: Path,
    pods: Path,
    policy: str,
    seed: int,
    fractions: list[int] | None = None,
    load: float | None = None,
    count: int | None = None,
) -> dict:
    """Requests arrive at creation_time and, once started, run for deletion_time minus
    creation_time, then leave. One that does not fit on arrival waits in the queue, as
    pending instances do in the product (console.instances.queue.schedule_pending): whenever a
    request leaves, the queue is tried oldest first, and one that does not fit does not hold back
    the others behind it (backfill), while an identical request is not tried again in the
    same pass. Arrivals come at the trace's times, or with `load` as `stream` spaces them;
    allocation is averaged over time from the first arrival to the last."""
    started = time.perf_counter()
    cluster = Cluster(read_hosts(nodes))
    capacity = MILLI * sum(len(host.gpus) for host in cluster.hosts.values())
    jobs = read_jobs(pods, fractions, seed)
    if load:
        jobs = stream(jobs, capacity, load, count or len(jobs), seed)
    first, last = jobs[0].arrival, jobs[-1].arrival
    choose = POLICIES[policy]
    # (time, 0: a departure | 1: an arrival, job): departures first at equal times
    events = [(job.arrival, 1, i) for i, job in enumerate(jobs)]
    heapq.heapify(events)
    queue: list[int] = []
    allocated = decisions = 0
    area = 0.0  # milli-GPU x time units, from the first arrival to the last
    clock, deciding_cpu = first, 0.0

    def start(i: int, placement: Placement | None, now: int) -> bool:
        if placement is None:
            return False
        nonlocal allocated
        cluster.apply(placement)
        job = jobs[i]
        job.started, job.placement = now, placement
        allocated += job.demand
        heapq.heappush(events, (now + job.duration, 0, i))
        return True

    while events:
        now, kind, i = heapq.heappop(events)
        area += allocated * (min(now, last) - min(clock, last))
        clock = now
        tick = time.process_time()
        if kind == 1:
            decisions += 1
            if not start(i, place(jobs[i].request, cluster, policy), now):
                queue.append(i)
        else:
            cluster.release(jobs[i].placement)
            allocated -= jobs[i].demand
            blocked: set[Request] = set()
            waiting = []
            for j in queue:
                request = jobs[j].request
                if request not in blocked:
                    decisions += 1
                    if start(j, choose(request, cluster), now):
                        continue
                    blocked.add(request)
                waiting.append(j)
            queue = waiting
        deciding_cpu += time.process_time() - tick
    waits = [job.started - job.arrival for job in jobs if job.started is not None]
    return {
        "allocated_share": area / (capacity * (last - first)) if last > first else 0.0,
        "wait_p50_s": percentile(waits, 50),
        "wait_p99_s": percentile(waits, 99),
        "wait_max_s": max(waits, default=0),
        "never_placed": sum(1 for job in jobs if job.started is None),
        "decisions_per_cpu_s": decisions / deciding_cpu if deciding_cpu else None,
        "capacity_gpus": capacity / MILLI,
        "requests": len(jobs),
        "wall_s": time.perf_counter() - started,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=Path, default=TRACES / "openb_node_list_gpu_node.csv")
    parser.add_argument("--pods", type=Path, default=TRACES / "openb_pod_list_default.csv")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--fractions",
        nargs="?",
        const=FRACTIONS,
        type=lambda text: [int(m) for m in text.split(",")],
        help="milli-GPU, comma-separated (default: the eleven of FRACTIONS): each fractional"
        " request asks for one, at random; the file's own fractions are the baseline",
    )
    parser.add_argument(
        "--dynamic", action="store_true", help="requests also leave; what does not fit waits"
    )
    parser.add_argument(
        "--load",
        type=float,
        help="--dynamic: arrivals evenly spaced so that the GPU time asked for is this many"
        " times the cluster's (default: the trace's own times)",
    )
    parser.add_argument(
        "--arrivals", type=int, help="--dynamic --load: how many arrive (default: the file's)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object, by policy")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="replay each workload this many times and keep the fastest (the placements are"
        " the same each time): decisions per CPU-second with less of the machine's noise",
    )
    args = parser.parse_args(argv)
    run = (
        functools.partial(dynamic, load=args.load, count=args.arrivals)
        if args.dynamic
        else functools.partial(fastest, args.repeat)
    )
    policies = args.policies.split(",")
    results = {
        policy: run(args.nodes, args.pods, policy, args.seed, args.fractions) for policy in policies
    }
    if args.dynamic:
        if args.json:
            print(json.dumps(results))
        else:
            print_dynamic(args.pods.name, results)
        return
    compare_with_best_fit(results)
    workloads = {"file's fractions": results}
    if args.fractions:
        baseline = {
            policy: fastest(args.repeat, args.nodes, args.pods, policy, args.seed)
            for policy in policies
        }
        compare_with_best_fit(baseline)
        for policy, r in results.items():
            r["baseline"] = baseline[policy]
            r["decisions_per_cpu_s_vs_baseline"] = (
                r["decisions_per_cpu_s"] / baseline[policy]["decisions_per_cpu_s"]
            )
        workloads = {"file's fractions": baseline, f"{len(args.fractions)} fractions": results}
    if args.json:
        print(json.dumps(results))
        return
    first = next(iter(results.values()))
    print(f"{args.pods.name}: {first['capacity_gpus']:.0f} GPUs")
    print(
        "workload          policy     requests  GPUs allocated  unallocated  vs best-fit"
        "  decisions/s  decisions/CPU-s  vs baseline  wall s"
    )
    for workload, by_policy in workloads.items():
        for policy, r in by_policy.items():
            versus = r.get("unallocated_vs_best_fit")
            speed = r.get("decisions_per_cpu_s_vs_baseline")
            speed = ratio(speed) if speed else "(baseline)" if args.fractions else ""
            print(
                f"{workload:<17} {policy:<10} {r['requests']:>8} {r['allocated_gpus']:>15.1f}"
                f" {r['unallocated_share']:>12.2%} {ratio(versus):>12}"
                f" {r['decisions_per_s']:>12.0f} {r['decisions_per_cpu_s']:>16.0f}"
                f" {speed:>12} {r['wall_s']:>7.1f}"
            )
    if args.fractions:
        print(f"{len(args.fractions)} fractions: {','.join(map(str, args.fractions))} milli-GPU")


def compare_with_best_fit(results: dict) -> None:
    """Each policy's unallocated share as a ratio to best-fit's, when best-fit ran."""
    if "best-fit" in results and results["best-fit"]["unallocated_share"]:
        for r in results.values():
            r["unallocated_vs_best_fit"] = (
                r["unallocated_share"] / results["best-fit"]["unallocated_share"]
            )


def ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def print_dynamic(pods: str, results: dict) -> None:
    first = next(iter(results.values()))
    print(f"{pods}, dynamic: {first['capacity_gpus']:.0f} GPUs")
    print("policy     GPUs allocated (time avg)  wait p50 s  wait p99 s  longest s  never")
    for policy, r in results.items():
        print(
            f"{policy:<10} {r['allocated_share']:>25.2%} {r['wait_p50_s']:>11.0f}"
            f" {r['wait_p99_s']:>11.0f} {r['wait_max_s']:>10.0f} {r['never_placed']:>6}"
        )


if __name__ == "__main__":
    main()
