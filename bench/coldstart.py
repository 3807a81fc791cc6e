"""Cold starts of a big image: launch → running when the host must pull the image, when it
holds it, when placement chooses between two such hosts, and after a pre-pull.

Starts, in a throwaway directory: the Redis `make run` would (bench/scratch.py), a SQLite
database (migrated here, with a minimal catalog), uvicorn and a Celery worker; Debian's
docker-registry on loopback; two Podman engines of their own storage, A and B. It builds an
image of --size-mb of random data over the demo image (nothing comes from an outside
registry), pushes it to the registry, and pulls it into B only. Then, each in a region of its
own, with simulated GPUs and the `oci` runtime (a Podman container per instance):

- (a) cold: one agent on A, which lacks the image; it is removed from A again after each run;
- (b) warm: one agent on B, which holds it;
- (c) choice: an agent on A, registered first (placement's tie-break would pick it), and one
  on B; image locality should place every launch on B;
- (d) pre-pull: the image is marked pre-pull in the catalog, the console hands the list to
  the agents, A's agents pull it in the background; then region (a)'s host launches it, once
  the pull's writes have reached the disk (`sync`: a pre-pull runs ahead of the launches it
  serves; right after a 2 GB pull the first container start waits ~1 s on the writeback).

Times: the REST API's launch until the instance reads `running` on the API (polled every
20 ms). The baseline, measured in the same run, is (b) itself: the targets are (c) and (d)
within 10 % of it; a bare `podman pull` of the image on A is printed beside (a).

    .venv/bin/python bench/coldstart.py                     # 2 GB, 3 cold runs, 10 warm ones
    .venv/bin/python bench/coldstart.py --size-mb 500 --runs 2 --warm-runs 5
"""

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scratch import make_run_redis, scratch_var_dir  # noqa: E402 - bench/ is on the path as a script
from stats import percentile  # noqa: E402 - bench/ is on the path when run as a script

CHUNK = 64 * 1024 * 1024
TARGET = 1.10  # (c) and (d) within 10 % of (b)


class Started:
    """A process started elsewhere (a Podman service, the registry), stopped with the others."""

    def __init__(self, name: str, popen):
        self.name = name
        self.popen = popen

    def stop(self) -> None:
        self.popen.terminate()
        self.popen.wait(10)


def row(name: str, values: list[float], baseline: list[float] | None = None) -> str:
    p50, p99 = percentile(values, 50), percentile(values, 99)
    ratio = f"{p50 / percentile(baseline, 50):.2f}×" if baseline and values else ""
    return f"| {name:<52} | {len(values):>3} | {p50:>8.2f} | {p99:>8.2f} | {ratio:>10} |"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=2000, help="random data over the demo")
    parser.add_argument("--runs", type=int, default=3, help="cold launches (a)")
    parser.add_argument("--warm-runs", type=int, default=10, help="launches of (b), (c), (d)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs)")
    args = parser.parse_args()
    for tool in ("podman", "docker-registry"):
        if shutil.which(tool) is None:
            print(f"{tool} is not installed (apt-get install podman docker-registry)")
            return 2

    tmp = scratch_var_dir("gpucloud-coldstart-")
    os.environ.setdefault("DATABASE_URL", "")
    redis_url, redis_proc, _ = make_run_redis(tmp)
    os.environ["REDIS_URL"] = redis_url

    import django

    from console import state_dir

    state_dir.prepare()
    django.setup()
    procs: list = [Started("redis", redis_proc)]
    storages: list[Path] = []
    try:
        return run(args, tmp, procs, storages)
    finally:
        for proc in reversed(procs):
            proc.stop()
        from agent.devtools import engine
        from agent.podman import podman_command, podman_env

        for storage in storages:
            subprocess.run(
                podman_command(storage, "system", "reset", "--force"),
                env=podman_env(),
                capture_output=True,
            )
            engine.unmount_layer_storage(storage, remove=True)
        if args.keep:
            print(f"logs in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def run(args, tmp: Path, procs: list, storages: list[Path]) -> int:
    from decimal import Decimal

    import httpx
    from django.core.management import call_command

    from accounts import services as accounts
    from accounts.roles import Role
    from agent.devtools import engine
    from agent.podman import podman_command, podman_env
    from console import processes
    from console.catalog.models import GpuModel, Image, Mode, Region, Spec
    from console.fleet import services as fleet
    from console.fleet.images import normalize
    from console.fleet.models import Host, HostImage
    from console.instances.models import Instance
    from tests.harness import Proc
    from tests.registry import start_registry

    call_command("migrate", verbosity=0)
    a100 = GpuModel.objects.create(
        code="a100-80gb", name="NVIDIA A100 80GB", memory_mib=81920, mig_capable=True
    )
    spec = Spec.objects.create(
        code="a100-quarter", name="A100 1/4", mode=Mode.SHARED, milli=250, gpu_memory_mib=20480,
        price_per_hour=Decimal("0.9"), gpu_model=a100, vcpus=1, ram_mib=256, disk_gib=1,
    )  # fmt: skip
    tenant = accounts.create_tenant("bench", gpu_quota="1000", max_instances=10_000)
    user = accounts.ensure_user("bench")
    accounts.add_member(tenant, user, Role.MEMBER)
    token = accounts.issue_token(user, tenant, "bench").raw

    env = processes.child_env()
    port = processes.free_port()
    url = f"http://127.0.0.1:{port}"
    web = Proc("web", processes.web_cmd(port, workers=processes.web_workers()), env, tmp)
    procs.append(web)
    procs.append(Proc("worker", processes.worker_cmd(), env, tmp))
    processes.wait_http(f"{url}/healthz", proc=web.popen)
    procs[-1].wait_for_log("ready.", timeout=60)

    registry = f"127.0.0.1:{processes.free_port()}"
    procs.append(Started("registry", start_registry(tmp / "registry", registry)))
    registries = tmp / "registries.conf"
    registries.write_text(f'[[registry]]\nlocation = "{registry}"\ninsecure = true\n')
    podman = {**podman_env(), "CONTAINERS_REGISTRIES_CONF": str(registries)}
    engines = {}
    for name in ("a", "b"):
        storage = tmp / f"storage-{name}"
        engine.layer_storage(storage, 40)
        storages.append(storage)
        service = engine.start_podman_service(
            tmp / f"podman-{name}.sock", tmp / f"podman-{name}.log", storage,
            CONTAINERS_REGISTRIES_CONF=str(registries),
        )  # fmt: skip
        procs.append(Started(f"engine-{name}", service))
        engine.build_demo_image(storage=storage)
        engines[name] = (f"unix://{tmp / f'podman-{name}.sock'}", storage)

    def on(name: str, *command: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            podman_command(engines[name][1], *command), env=podman, capture_output=True,
            text=True, check=check,
        )  # fmt: skip

    # the big image: random data over the demo image, built on A, pushed, then only on B
    reference = f"{registry}/gpucloud/big:{os.getpid()}"
    context = tmp / "big"
    context.mkdir()
    with open(context / "blob", "wb") as blob:
        left = args.size_mb * 1_000_000
        while left:
            blob.write(os.urandom(min(CHUNK, left)))
            left -= min(CHUNK, left)
    (context / "Containerfile").write_text(f"FROM {engine.DEMO_IMAGE}\nCOPY blob /blob\n")
    started = time.perf_counter()
    on("a", "build", "-q", "-t", reference, str(context))
    on("a", "push", reference)
    on("a", "rmi", reference)
    shutil.rmtree(context)
    on("b", "pull", reference)
    print(f"image {reference} ({args.size_mb} MB of random data over the demo image) built, "
          f"pushed and pulled into B in {time.perf_counter() - started:.0f} s")  # fmt: skip
    image = Image.objects.create(
        name="big", reference=reference, cuda_version="", command=["sleep", "600"]
    )

    def start_host(hostname: str, region: str, engine_name: str) -> Host:
        _, raw = fleet.create_join_token(region)
        cmd = processes.agent_cmd(
            url, tmp / f"agent-{hostname}", f"127.0.0.1:{processes.free_port()}",
            join_token=raw, hostname=hostname, region=region, gpus=2, model="a100-80gb",
            mode="shared", runtime="oci", engine_url=engines[engine_name][0],
            heartbeat_interval=1.0,
        )  # fmt: skip
        procs.append(Proc(f"agent-{hostname}", cmd, env, tmp))
        deadline = time.monotonic() + 60
        while not Host.objects.filter(name=hostname, status="active").exists():
            if time.monotonic() > deadline:
                raise TimeoutError(procs[-1].log()[-2000:])
            time.sleep(0.1)
        return Host.objects.get(name=hostname)

    for code in ("cold", "warm", "choice"):
        Region.objects.create(code=code, name=code)
    hosts = {
        "cold": start_host("cold-a", "cold", "a"),
        "warm": start_host("warm-b", "warm", "b"),
        "choice-a": start_host("choice-a", "choice", "a"),  # first: the tie-break's pick
        "choice-b": start_host("choice-b", "choice", "b"),
    }
    wait(lambda: HostImage.objects.filter(reference=normalize(reference)).count() == 2,
         "B's agents to report the image")  # fmt: skip

    client = httpx.Client(
        base_url=f"{url}/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )
    serial = iter(range(10**6))

    def launch(region: str) -> tuple[float, str]:
        """Launch → running (seconds) and the host it ran on; the instance is terminated."""
        body = {"name": f"{region}-{next(serial)}", "spec": spec.code, "image": image.name,
                "region": region}  # fmt: skip
        began = time.perf_counter()
        response = client.post("/instances/", json=body)
        response.raise_for_status()
        iid = response.json()["id"]
        deadline = time.monotonic() + 600
        while (state := client.get(f"/instances/{iid}/").json()["state"]) != "running":
            if state == "failed" or time.monotonic() > deadline:
                raise RuntimeError(
                    f"instance {iid} {state}: {client.get(f'/instances/{iid}/').json()}"
                )
            time.sleep(0.02)
        took = time.perf_counter() - began
        host = Instance.objects.get(pk=iid).current_allocation().host.name
        client.post(f"/instances/{iid}/terminate/").raise_for_status()
        wait(lambda: Instance.objects.get(pk=iid).state == "terminated", f"{iid} terminated")
        return took, host

    def clear_a() -> None:
        """A lacks the image again (both of A's agents share its engine), and says so."""
        on("a", "rmi", "-f", reference, check=False)
        for host in (hosts["cold"], hosts["choice-a"]):
            refresh(host)

    results: dict[str, list[float]] = {}
    where: dict[str, list[str]] = {}
    for label, region, runs, cold in (
        ("a", "cold", args.runs, True),
        ("b", "warm", args.warm_runs, False),
        ("c", "choice", args.warm_runs, False),
    ):
        for n in range(runs):
            if cold or n == 0:
                clear_a()
            took, host = launch(region)
            results.setdefault(label, []).append(took)
            where.setdefault(label, []).append(host)

    # a bare pull of the image on A (no console, no agent): what (a) cannot beat
    on("a", "rmi", "-f", reference, check=False)
    began = time.perf_counter()
    on("a", "pull", "-q", reference)
    bare = [time.perf_counter() - began]
    clear_a()

    # (d) the image marked pre-pull: the console hands the list to the agents, A's pull it
    began = time.perf_counter()
    image.pre_pull = True
    image.save()
    wait(lambda: all(_pulled(h, reference) for h in hosts.values()), "the pre-pulls", 900)
    pre_pull = time.perf_counter() - began
    os.sync()  # the pull's dirty pages written out, as they are when a pre-pulled image is used
    for _ in range(args.warm_runs):
        took, host = launch("cold")
        results.setdefault("d", []).append(took)
        where.setdefault("d", []).append(host)

    b = results["b"]
    print()
    print(
        f"gpucloud cold-start bench: a {args.size_mb} MB layer over the demo image from a "
        f"loopback docker-registry; simulated hosts with the oci runtime on Podman; "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
    )
    print()
    print(f"| {'launch → running':<52} |   n |  p50 s   |  p99 s   | p50 / (b)  |")
    print(f"|{'-' * 54}|-----|----------|----------|------------|")
    print(row("bare `podman pull` of the image on A (baseline of a)", bare))
    print(row("(a) a host without the image (pulls it)", results["a"], b))
    print(row("(b) a host with the image (baseline)", b, b))
    print(row("(c) placement between the two", results["c"], b))
    print(row("(d) after a pre-pull", results["d"], b))
    print()
    for label in ("a", "b", "c", "d"):
        print(f"({label}) each run, s: {' '.join(f'{t:.2f}' for t in results[label])}")
    print()
    chose_b = where["c"].count("choice-b")
    print(f"(c) placed {chose_b} of {len(where['c'])} launches on the host with the image; "
          f"(d) the pre-pull took {pre_pull:.0f} s in the background")  # fmt: skip
    met = True
    for label in ("c", "d"):
        ratio = percentile(results[label], 50) / percentile(b, 50)
        ratio99 = percentile(results[label], 99) / percentile(b, 99)
        ok = ratio <= TARGET and ratio99 <= TARGET
        met &= ok
        print(f"({label}) / (b): p50 {ratio:.2f}×, p99 {ratio99:.2f}×; target ≤ {TARGET:.2f}×: "
              f"{'met' if ok else 'MISSED'}")  # fmt: skip
    return 0 if met and chose_b == len(where["c"]) else 1


def wait(check, what: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waiting for {what}")
        time.sleep(0.1)


def refresh(host) -> None:
    """Have the host's agent read its engine's images now (it does every 30 s by itself:
    the bench removed one behind its back) and take its inventory as a heartbeat would."""
    from console.fleet import agent_client
    from console.fleet import services as fleet

    inventory = agent_client.inventory(host)
    fleet.record_heartbeat(host, inventory=inventory, inventory_digest=inventory["digest"])


def _pulled(host, reference: str) -> bool:
    from console.fleet.images import normalize
    from console.fleet.models import Host

    states = Host.objects.get(pk=host.pk).pre_pulls
    return any(s["reference"] == normalize(reference) and s["state"] == "pulled" for s in states)


if __name__ == "__main__":
    sys.exit(main())
