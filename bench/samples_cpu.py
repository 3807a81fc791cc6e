"""CPU per agent sample push, in-process: the synchronous part of POST /agent/v1/samples (the
secret's lookup, the batch's checks, ingest and the live window's writes) for an 8-GPU host
whose GPUs each run an allocation (16 samples a push, as bench/metrics.py's agents send).

    .venv/bin/python bench/samples_cpu.py [--pushes 2000]      # in-process window, SQLite
    REDIS_URL=redis://127.0.0.1:6379/9 .venv/bin/python bench/samples_cpu.py   # Redis window

Prints the CPU (time.process_time) and wall time per push, and the SQL queries and Redis
commands per push."""

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.scratch import scratch_var_dir  # noqa: E402

GPUS = 8


def world():
    from console.catalog.models import Mode
    from console.fleet.models import Gpu, Host
    from console.instances.models import Allocation, Instance, State
    from tests.factories import (
        GpuModelFactory,
        ImageFactory,
        RegionFactory,
        SpecFactory,
        TenantFactory,
    )

    region = RegionFactory()
    model = GpuModelFactory()
    spec = SpecFactory(gpu_model=model, mode=Mode.WHOLE)
    image = ImageFactory()
    tenant = TenantFactory()
    host = Host(name="bench-host", region=region, address="http://10.0.0.1:9101")
    host.set_secret("bench-secret-of-bench-host")
    host.save()
    gpus = []
    for index in range(GPUS):
        Gpu.objects.create(
            host=host, index=index, uuid=f"GPU-bench-{index}", model=model,
            name="NVIDIA A100-SXM4-80GB", memory_mib=81920, mode=Mode.WHOLE,
        )  # fmt: skip
        instance = Instance.objects.create(
            tenant=tenant, name=f"i{index}", spec=spec, image=image, region=region,
            state=State.RUNNING,
        )  # fmt: skip
        alloc = Allocation.objects.create(
            id=f"alloc-{index}", instance=instance, host=host, mode=Mode.WHOLE,
            request={"mode": "whole", "gpus": [index]},
        )  # fmt: skip
        gpus.append((index, f"GPU-bench-{index}", alloc.id))
    return host, gpus


def push(host_id: int, gpus, ts: float) -> bytes:
    samples = []
    for index, uuid, alloc in gpus:
        used = random.randint(1000, 70000)
        base = {
            "ts": ts, "gpu_index": index, "gpu_uuid": uuid, "mig_uuid": None,
            "gpu_util": round(random.uniform(20, 100), 1), "mem_used_mib": used,
            "mem_total_mib": 81920, "temperature_c": round(random.uniform(40, 80), 1),
            "power_w": round(random.uniform(80, 400), 1), "sm_clock_mhz": 1410, "ecc_errors": 0,
            "healthy": True, "processes": [{"pid": 4242, "used_mib": used}],
        }  # fmt: skip
        samples.append({**base, "kind": "gpu", "allocation": None})
        samples.append({**base, "kind": "allocation", "allocation": alloc})
    return json.dumps({"host_id": host_id, "samples": samples}).encode()


def count(authorization: str, bodies: list[bytes]) -> tuple[float, float]:
    """SQL queries and Redis commands per push (counted apart from the timed pushes)."""
    import redis
    from django.db import connection

    from console.metrics.asgi import authenticated_body

    commands = 0
    execute = redis.client.Pipeline.execute
    execute_command = redis.Redis.execute_command

    def counted(pipe, *args, **kwargs):
        nonlocal commands
        commands += len(pipe.command_stack)
        return execute(pipe, *args, **kwargs)

    def counted_command(client, *args, **kwargs):  # one command, a Lua script's call included
        nonlocal commands
        commands += 1
        return execute_command(client, *args, **kwargs)

    redis.client.Pipeline.execute = counted
    redis.Redis.execute_command = counted_command
    connection.force_debug_cursor = True
    try:
        for body in bodies:
            authenticated_body(authorization, body)
        queries = len(connection.queries)
    finally:
        connection.force_debug_cursor = False
        redis.client.Pipeline.execute = execute
        redis.Redis.execute_command = execute_command
    return queries / len(bodies), commands / len(bodies)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pushes", type=int, default=2000)
    args = parser.parse_args()
    scratch_var_dir("gpucloud-samples-cpu-")
    import django

    from console import state_dir

    state_dir.prepare()
    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from console.metrics import live
    from console.metrics.asgi import authenticated_body

    call_command("migrate", verbosity=0)
    live.store().clear()
    host, gpus = world()
    authorization = "Bearer " + host.secret
    start = time.time() - args.pushes * 0.01 - 5
    bodies = [push(host.pk, gpus, start + n * 0.01) for n in range(args.pushes + 50)]
    for body in bodies[:50]:  # warm up: attribution cache, connections
        assert authenticated_body(authorization, body)[0] == 202
    cpu, wall = time.process_time(), time.perf_counter()
    for body in bodies[50:]:
        status, answer = authenticated_body(authorization, body)
        assert status == 202 and answer["ignored"] == 0, answer
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    queries, commands = count(authorization, [push(host.pk, gpus, time.time()) for _ in range(20)])
    live.store().clear()
    n = args.pushes
    print(
        f"window={'redis' if settings.REDIS_URL else 'memory'} pushes={n} "
        f"samples/push={2 * GPUS}: CPU {cpu / n * 1000:.3f} ms/push, wall {wall / n * 1000:.3f} "
        f"ms/push, {queries:.2f} queries/push, {commands:.1f} Redis commands/push"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
