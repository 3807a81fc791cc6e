"""Placement quality and speed on the Alibaba GPU-sharing trace (../shared/traces/README.md).

Every host of the node list comes in with all its GPUs in shared mode; requests arrive one by
one in creation_time order (file order where the list has no creation_time) and nothing
departs; each is placed by console.scheduler.placement.place and applied, or rejected. When
the file runs out before the arrived GPU demand reaches the cluster's capacity, requests
keep arriving, drawn from the same file at random (--seed). At the moment the arrived demand
reaches 100% of capacity: GPUs allocated (milli allocated / 1000) and the unallocated share.

Trace requests map to gpucloud requests as: num_gpu 0 -> vCPU and RAM only; num_gpu 1 and
gpu_milli < 1000 -> a shared fraction; otherwise num_gpu whole GPUs, each shared GPU at 1000
milli (so nobody else holds any of it). The trace has no GPU memory: fractions carry no
memory cap, so GPU memory never binds (GPUs are given TRACE_GPU_MEMORY_MIB for the record).

    .venv/bin/python bench/scheduler.py --nodes ../shared/traces/openb_node_list_gpu_node.csv \\
        --pods ../shared/traces/openb_pod_list_default.csv [--json] [--policies fgd] [--seed 1]

A workload with more distinct fractions (the scheduler's cost must not grow with them):
--fractions 100,125,200,300,333,600,750 gives each fractional request of the file one of
these instead, drawn at random (--seed); the hosts stay the same.

decisions_per_s and decisions_per_cpu_s count place() and apply() together, in wall-clock
and in CPU time (the CPU figure does not move with what else the machine runs).
"""

import argparse
import csv
import itertools
import json
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from console.scheduler.cluster import Cluster  # noqa: E402
from console.scheduler.model import MILLI, SHARED, Gpu, Host, Request  # noqa: E402
from console.scheduler.placement import POLICIES, place  # noqa: E402

TRACES = ROOT.parent / "shared" / "traces"
TRACE_GPU_MEMORY_MIB = 16384
REGION = "trace"


def read_hosts(path: Path) -> list[Host]:
    with path.open(newline="") as f:
        return [
            Host(
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


def read_requests(
    path: Path, fractions: list[int] | None = None, seed: int = 1
) -> list[tuple[Request, int]]:
    """(request, GPU demand in milli) in arrival order; with `fractions`, each fractional
    request asks for one of them instead, drawn at random (`seed`)."""
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if fractions:
        draw = random.Random(seed)
        for row in rows:
            if int(row["num_gpu"]) == 1 and int(row["gpu_milli"]) < MILLI:
                row["gpu_milli"] = str(draw.choice(fractions))
    if rows and "creation_time" in rows[0]:
        rows.sort(key=lambda row: int(row["creation_time"]))
    return [(to_request(row), int(row["num_gpu"]) * int(row["gpu_milli"])) for row in rows]


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=Path, default=TRACES / "openb_node_list_gpu_node.csv")
    parser.add_argument("--pods", type=Path, default=TRACES / "openb_pod_list_default.csv")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--fractions",
        type=lambda text: [int(m) for m in text.split(",")],
        help="milli-GPU, comma-separated: each fractional request asks for one, at random",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object, by policy")
    args = parser.parse_args(argv)
    results = {
        policy: replay(args.nodes, args.pods, policy, args.seed, args.fractions)
        for policy in args.policies.split(",")
    }
    if args.json:
        print(json.dumps(results))
        return
    first = next(iter(results.values()))
    print(f"{args.pods.name}: {first['capacity_gpus']:.0f} GPUs, {first['requests']} requests")
    print("policy     GPUs allocated  unallocated  decisions/s  decisions/CPU-s  wall s")
    for policy, r in results.items():
        print(
            f"{policy:<10} {r['allocated_gpus']:>14.1f} {r['unallocated_share']:>12.2%}"
            f" {r['decisions_per_s']:>12.0f} {r['decisions_per_cpu_s']:>16.0f} {r['wall_s']:>7.1f}"
        )


if __name__ == "__main__":
    main()
