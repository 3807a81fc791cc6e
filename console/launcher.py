"""`make run`: the whole console on one machine — migrations, static files, the demo, the ASGI
server, a Celery worker, Celery beat and two simulated host agents. Embedded by default: SQLite,
and a `redis-server` of its own where one is installed, else a Redis-protocol server inside this
process; with DATABASE_URL and REDIS_URL it runs on those. Ctrl-C stops the instances (through
the worker and the agents, as a tenant's stop does), then the processes, and leaves nothing
running: no container, no mounted disk.

The agents run their workloads as real containers when a container engine is at hand (a Docker
or Podman socket, or Podman installed, whose API this starts), else as processes.

The state directory (GPUCLOUD_VAR_DIR, var/) is this user's alone: 0700, and everything in it
0600 (0700 a directory), since this process and all it starts make files with umask 077. Podman's
own directory (its socket and storage) lies beside it, in `<var>-podman/`: Podman makes every
directory above a container's root file system traversable, which it may do to its own.

With Podman started here, the demo catalog's images are built into its storage: the busybox one
before the agents start (seconds), JupyterLab's and PyTorch's in the background (agent/images.py:
minutes the first time, seconds once cached; nothing once built), saying how far in
`<var>/image-builds.json`, which the console's pages show. GPUCLOUD_BUILD_IMAGES=0 skips that
background build (the tests that start make run and need no such image).

`python -m console.launcher images` (`make images`) builds the same images into the same
storage, in the foreground, whether make run is running or not."""

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import docker

from agent import images
from agent.backends.sim import sim_capacity
from agent.devtools import engine
from agent.host import memory_mib
from agent.podman import EngineError
from agent.runtimes.oci import LABEL_INSTANCE, running_engine
from console import processes, state_dir

ROOT = Path(__file__).resolve().parent.parent
REGION = "local-1"
# what this process and its children make is their user's alone (the engine aside)
PRIVATE_UMASK = 0o077
# Seconds Ctrl-C waits for the instances to stop before it stops the processes anyway.
STOP_INSTANCES_WAIT = 60
# the sparse image Podman's storage lies in (it takes of the host what is written to it)
PODMAN_STORAGE_GIB = 100
# where the SSH front listens when SSH_FRONT is unset (a free port if this one is taken)
SSH_FRONT_PORT = 2222
# what the console reads to say how far the background build of the demo images is
IMAGE_BUILDS = "image-builds.json"
# children that may end on their own: the background build of the images
MAY_END = {"images"}
DEMO_AGENTS = [
    # hostname, GPUs, model, per-GPU modes
    ("host-a", 8, "a100-80gb", "mig,mig,mig,mig,shared,shared,shared,shared"),
    ("host-b", 8, "h100-80gb", "whole"),
]


def simulated_hosts(machine_cpus: int, machine_mib: int) -> list[str]:
    """What the banner says of the demo hosts: they simulate GPU servers, with a server's vCPUs
    and RAM (the catalog's specs are sized for those), which may be beyond this machine; then
    their workloads share what it has."""
    lines = []
    for hostname, gpus, model, _ in DEMO_AGENTS:
        cpus, mib = sim_capacity(gpus)
        beyond = cpus > machine_cpus or mib > machine_mib
        lines.append(
            f"{hostname}: simulated {gpus}× {model}, {cpus} vCPU, {mib // 1024} GiB RAM"
            + (
                f" — beyond this machine's {machine_cpus} vCPU, {machine_mib // 1024} GiB: its "
                "instances share those whatever their specs say (`free` in one shows this "
                "machine's memory)"
                if beyond
                else ""
            )
        )
    return lines


def manage(*args: str, env: dict[str, str]) -> str:
    result = subprocess.run(
        [processes.PYTHON, str(ROOT / "manage.py"), *args],
        env=env,
        cwd=ROOT,
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    return result.stdout


def _agent_port(hostname: str, var_dir: Path, joined: bool, env: dict[str, str]) -> int:
    """The port of a demo agent's API: the one it had (a heartbeat never moves a host), else a
    free one, which the console is told of as an operator would (set_host_address)."""
    kept = var_dir / "agents" / f"{hostname}.port"
    kept.parent.mkdir(parents=True, exist_ok=True)
    before = int(kept.read_text()) if kept.exists() else 0
    port = processes.port_or_free(before) if before else processes.free_port()
    kept.write_text(str(port))
    if joined and port != before:
        try:
            manage("set_host_address", hostname, f"http://127.0.0.1:{port}", env=env)
        except subprocess.CalledProcessError:
            print(f"{hostname}: its new address was refused (see above)", file=sys.stderr)
    return port


def choose_runtime(var_dir: Path, children: list) -> tuple[str, str | None, str]:
    """(runtime, engine URL, what to tell the user): a running engine's socket, else Podman's
    API started here (supervised with the other children, the demo image built), else
    processes; processes too when not root, since the agent must set up the containers'
    isolation (nftables, user namespaces) itself."""
    if os.geteuid() != 0:  # the agent isolates containers with nftables and user namespaces
        return "process", None, "processes (containers need root: run `sudo make run`)"
    url = running_engine()
    if url:
        return "oci", url, f"containers through the engine at {url}"
    if engine.podman() is None:
        return (
            "process",
            None,
            (
                "processes (no container engine: `apt-get install podman runc busybox-static` "
                "gives real containers)"
            ),
        )
    socket = podman_dir(var_dir) / "podman.sock"
    # storage of its own that bounds each container's writable layer (xfs with pquota, or
    # btrfs), unmounted when make run ends
    storage = podman_storage(var_dir)
    engine.layer_storage(storage, PODMAN_STORAGE_GIB)
    children.append(
        ("podman", engine.start_podman_service(socket, var_dir / "podman.log", storage))
    )
    engine.build_demo_image(storage=storage)
    return "oci", f"unix://{socket}", "containers through Podman (started here)"


def start_image_build(var_dir: Path, env: dict[str, str]) -> subprocess.Popen | None:
    """The demo catalog's JupyterLab and PyTorch images built into make run's Podman storage in
    the background (a process of its own, which the console does not wait for), saying how far
    in <var>/image-builds.json; None where GPUCLOUD_BUILD_IMAGES=0."""
    progress = var_dir / IMAGE_BUILDS
    progress.unlink(missing_ok=True)  # an earlier run's
    if os.environ.get("GPUCLOUD_BUILD_IMAGES", "1") == "0":
        return None
    log = (var_dir / "images.log").open("ab")
    command = [processes.PYTHON, "-m", "agent.images", "--storage", str(podman_storage(var_dir))]
    return subprocess.Popen(
        [*command, "--progress", str(progress)],
        env=env,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        process_group=0,
        umask=0o022,  # the cache's tars and the images' files are everyone's to read
    )


def images_main() -> int:
    """`make images`: the demo catalog's images built into make run's Podman storage (mounted
    for the build where make run is not running), in the foreground."""
    var_dir = Path(os.environ.get("GPUCLOUD_VAR_DIR", ROOT / "var")).resolve()
    storage = podman_storage(var_dir)
    mounted_here = engine.mount_type(storage) is None
    try:
        engine.layer_storage(storage, PODMAN_STORAGE_GIB)
        print(f"building into {storage} (make run's engine)", flush=True)
        engine.build_demo_image(storage=storage)
        return images.main(["--storage", str(storage), *sys.argv[2:]])
    except EngineError as error:  # not root, no podman or busybox: said in full
        print(error, file=sys.stderr)
        return 1
    finally:
        if mounted_here:
            engine.unmount_layer_storage(storage)


def podman_dir(var_dir: Path) -> Path:
    return var_dir.with_name(f"{var_dir.name}-podman")


def podman_storage(var_dir: Path) -> Path:
    return podman_dir(var_dir) / "storage"


def private_state(var_dir: Path) -> None:
    """The state directory 0700 and its files 0600 from now on (umask 077 here and in every
    child), made with its secrets before any child starts (console.state_dir), and what an
    earlier run left in it with more made so too."""
    os.umask(PRIVATE_UMASK)
    state_dir.prepare()
    for entry in var_dir.iterdir():
        mode = entry.lstat().st_mode
        if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
            entry.chmod(stat.S_IMODE(mode) & 0o700)


def main() -> int:
    port = int(os.environ.get("PORT", "8000"))
    var_dir = Path(os.environ.get("GPUCLOUD_VAR_DIR", ROOT / "var")).resolve()
    private_state(var_dir)
    children: list[tuple[str, subprocess.Popen]] = []
    try:
        return serve(port, var_dir, children)
    finally:
        stop_all(children)
        unmount_disks(var_dir)
        engine.unmount_layer_storage(podman_storage(var_dir))


def serve(port: int, var_dir: Path, children: list) -> int:
    redis_url = os.environ.get("REDIS_URL")
    if redis_url:
        broker = redis_url
    else:
        redis_url, redis_proc = processes.start_local_redis(var_dir / "redis.log")
        if redis_proc is None:
            broker = "embedded Redis-protocol server (`apt-get install redis-server`: faster)"
        else:
            children.append(("redis", redis_proc))
            broker = f"redis-server (started here, at {redis_url}, keeping nothing on disk)"
    env = processes.child_env(REDIS_URL=redis_url, GPUCLOUD_VAR_DIR=str(var_dir))
    # one ssh line per instance, wherever it runs: the SSH front (console/instances/ssh_front.py)
    env.setdefault("SSH_FRONT", f"127.0.0.1:{processes.port_or_free(SSH_FRONT_PORT)}")
    # A demo on one machine: webhooks may go to local receivers (http, loopback), and mail is
    # written to files in var/mail unless an SMTP server is set (settings.py).
    env.setdefault("NOTIFICATIONS_ALLOW_PRIVATE_ADDRESSES", "true")
    if not env.get("EMAIL_HOST"):
        env.setdefault("EMAIL_BACKEND", "django.core.mail.backends.filebased.EmailBackend")
    url = f"http://127.0.0.1:{port}"

    manage("migrate", "--noinput", "-v0", env=env)
    # Fingerprinted, compressed static files for whitenoise (settings.STATIC_COLLECTED): a minute
    # the first time (brotli), seconds after.
    print("collecting static files…", flush=True)
    manage("collectstatic", "--noinput", "-v0", env=env)
    demo = manage("seed_demo", "--yes-demo", env=env)

    def start(name: str, cmd: list[str]) -> None:
        log = (var_dir / f"{name}.log").open("ab")
        # In a process group of their own: Ctrl-C reaches this process only, which stops the
        # instances through them before it stops them.
        children.append(
            (
                name,
                subprocess.Popen(
                    cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, process_group=0
                ),
            )
        )

    # one uvicorn process per core (WEB_CONCURRENCY): they share the Redis, the broker and
    # channel layer, so websockets reach their groups from any of them
    start("web", processes.web_cmd(port, workers=processes.web_workers()))
    web = children[-1][1]
    start("worker", processes.worker_cmd(concurrency=processes.worker_concurrency()))
    start("beat", processes.beat_cmd(var_dir))
    start("ssh-front", [processes.PYTHON, str(ROOT / "manage.py"), "ssh_front"])
    processes.wait_http(f"{url}/healthz", timeout=60, proc=web)
    runtime, engine_url, runs_as = choose_runtime(var_dir, children)
    builds = "none (no Podman started here: `sudo make images` builds them into the default one)"
    if any(name == "podman" for name, _ in children):
        build = start_image_build(var_dir, env)
        if build:
            children.append(("images", build))
            builds = (
                "JupyterLab and PyTorch being built in the background into make run's Podman "
                f"(how far: the console's pages; log {var_dir / 'images.log'})"
            )
        else:
            builds = "JupyterLab and PyTorch not built (GPUCLOUD_BUILD_IMAGES=0: `make images`)"
    for hostname, gpus, model, mode in DEMO_AGENTS:
        state_dir = var_dir / "agents" / hostname
        token = None
        if not (state_dir / "identity.json").exists():
            token = (
                manage(
                    "create_join_token", "--region", REGION, "--note", f"demo {hostname}", env=env
                )
                .strip()
                .splitlines()[-1]
            )
        listen = f"127.0.0.1:{_agent_port(hostname, var_dir, token is None, env)}"
        start(
            f"agent-{hostname}",
            processes.agent_cmd(
                url, state_dir, listen, join_token=token, hostname=hostname, region=REGION,
                gpus=gpus, model=model, mode=mode, runtime=runtime, engine_url=engine_url,
                ssh_listen=f"127.0.0.1:{processes.free_port()}",
            ),
        )  # fmt: skip

    ports_domain = os.environ.get("PORTS_DOMAIN") or "ports.localhost"  # settings' default
    if ":" not in ports_domain:
        ports_domain += f":{port}"
    print(
        f"\ngpucloud is running at {url}\n"
        f"  database: {'PostgreSQL' if os.environ.get('DATABASE_URL') else 'SQLite (embedded)'}; "
        f"broker and channel layer: {broker}\n"
        f"  processes: {'redis, ' if children[0][0] == 'redis' else ''}"
        f"web ({processes.web_workers()} uvicorn workers), worker, beat, ssh-front "
        f"({env['SSH_FRONT']}), agent-host-a, agent-host-b (logs in {var_dir})\n"
        f"  workloads: {runs_as}\n"
        f"  images: {builds}\n"
        + "".join(f"  {line}\n" for line in simulated_hosts(os.cpu_count() or 1, memory_mib()))
        + f"  API docs: {url}/api/v1/docs/   admin: {url}/admin/\n"
        f"  instances' web ports: http://i<id>-<port>.{ports_domain}/ (PORTS_DOMAIN)\n"
        + "".join(f"  {line.strip()}\n" for line in demo.splitlines() if "login" in line)
        + "Press Ctrl-C to stop.",
        flush=True,
    )

    stopping = False

    def stop(*_):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    exit_code = 0
    while not stopping:
        for name, proc in children:
            if proc.poll() is not None and name not in MAY_END:
                print(f"{name} exited with {proc.returncode}; see {var_dir / name}.log", flush=True)
                stopping, exit_code = True, 1
        time.sleep(0.5)
    print(f"Stopping the instances (at most {STOP_INSTANCES_WAIT} s)…", flush=True)
    stopped = subprocess.run(
        [processes.PYTHON, str(ROOT / "manage.py"), "stop_instances",
         "--wait", str(STOP_INSTANCES_WAIT)],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True, process_group=0,
    )  # fmt: skip
    print(f"  {stopped.stdout.strip()}", flush=True)
    if engine_url:
        remove_containers(engine_url, var_dir)
    print("Stopping the processes…", flush=True)
    return exit_code


def remove_containers(engine_url: str, var_dir: Path) -> None:
    """Remove the containers that a stop which did not finish in time left: those of this
    var dir's agents (their disks lie under it)."""
    client = docker.DockerClient(base_url=engine_url)
    for container in client.containers.list(all=True, filters={"label": LABEL_INSTANCE}):
        if any(
            mount.get("Source", "").startswith(f"{var_dir}/")
            for mount in container.attrs.get("Mounts") or []
        ):
            print(f"  removing container {container.name}, which did not stop", flush=True)
            container.remove(force=True)


def unmount_disks(var_dir: Path) -> None:
    """Unmount the agents' disks: an agent keeps a stopped instance's disk mounted, and
    mounts it again when the instance starts."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        point = line.split(" ")[1]
        if point.startswith(f"{var_dir}/agents/"):
            subprocess.run(["umount", point], check=False)


def stop_all(children: list) -> None:
    """Stop the children, the last started first and Redis after all the others (they use it
    while they stop); kill what does not stop within 15 s."""
    ordered = [proc for name, proc in reversed(children) if name != "redis"]
    last = [proc for name, proc in children if name == "redis"]
    for group in (ordered, last):
        for proc in group:
            if proc.poll() is None:
                proc.terminate()
        for proc in group:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    sys.exit(images_main() if sys.argv[1:2] == ["images"] else main())
