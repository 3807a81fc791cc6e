"""`gpucloud-agent` / `python -m agent`: run the host agent."""

import argparse
import logging
import os
import socket
import sys
from pathlib import Path

import pynvml
from docker.errors import DockerException

from agent import integers, logs
from agent.allocations import MODES
from agent.api import create_app
from agent.backends.nvml import NvmlBackend
from agent.backends.sim import SimBackend, sim_capacity
from agent.control import RegistrationError, Reporter, Servers, ensure_identity
from agent.firewall import EGRESS, FirewallError
from agent.gpu_models import MODELS
from agent.host import LocalHost
from agent.identity import HostSecret
from agent.image_store import DISK_HIGH_PERCENT, DISK_LOW_PERCENT
from agent.runtimes.oci import OciRuntime
from agent.runtimes.process import ProcessRuntime
from agent.runtimes.sim import SimRuntime
from agent.service import lifespan, serve
from agent.ssh import Gateway
from agent.state import PRIVATE_UMASK, StateStore

log = logging.getLogger(__name__)

DEFAULT_SAMPLE_INTERVAL = 1.0
DEFAULT_HEARTBEAT_INTERVAL = 5.0


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text}")
    return value


def _percents(text: str) -> tuple[int, int]:
    high, _, low = text.partition(":")
    try:
        high, low = integers.parse(high, maximum=100), integers.parse(low, minimum=1)
    except integers.NotAWholeNumber:
        high = low = 0
    if not 0 < low < high:
        raise argparse.ArgumentTypeError(f"must be HIGH:LOW, 0 < LOW < HIGH <= 100, not {text}")
    return high, low


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpucloud-agent",
        description="gpucloud host agent: serves this host's GPUs to the control plane.",
        epilog="commands:\n  probe [--json]  report what this host offers and what to fix before "
        "joining it (read-only; `gpucloud-agent probe --help`)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--server",
        action="append",
        default=[],
        help="the console's URL, e.g. http://console:8000 (a load balancer, or one web process); "
        "give it several times (or comma-separated) for several web processes: the agent "
        "stays with one while it answers and moves to the next when it cannot reach it",
    )
    p.add_argument("--join-token", help="one-time token to register this host (first start)")
    p.add_argument("--secret", help="run standalone, without --server, with this API secret")
    p.add_argument("--backend", choices=("sim", "nvml"), default="sim")
    p.add_argument("--gpus", type=int, help="sim: number of simulated GPUs (required)")
    p.add_argument("--model", choices=sorted(MODELS), default="a100-80gb", help="sim: GPU model")
    p.add_argument(
        "--mode",
        help="whole, mig or shared, or one per GPU comma-separated (mig,mig,shared,…); "
        "sim default whole; nvml: mig where MIG is enabled, else this (default whole)",
    )
    p.add_argument(
        "--manage-mig",
        action="store_true",
        help="nvml: create and destroy MIG instances for allocations (else only use existing)",
    )
    p.add_argument(
        "--runtime",
        choices=("sim", "process", "oci"),
        default="sim",
        help="oci: a container per allocation through the Docker Engine API (Docker or "
        "Podman); process: a process per allocation; sim: no workload",
    )
    p.add_argument(
        "--engine-url",
        help="oci: the engine's API, e.g. unix:///run/podman/podman.sock (default: Podman's "
        "usual sockets, then Docker's)",
    )
    p.add_argument(
        "--egress",
        choices=EGRESS,
        default="all",
        help="oci: where containers may connect beyond their tenant's network (never the "
        "host itself, nor another tenant): all (wherever the host routes, but link-local "
        "addresses such as cloud metadata), public (not private networks either: 10/8, "
        "172.16/12, 192.168/16, 100.64/10, fc00::/7), none",
    )
    p.add_argument(
        "--stop-grace", type=_seconds, default=10.0, help="seconds between SIGTERM and SIGKILL"
    )
    p.add_argument("--listen", default="127.0.0.1:9101", help="HOST:PORT of the agent's API")
    p.add_argument(
        "--ssh-listen",
        default="0.0.0.0:2222",
        help="HOST:PORT of the SSH gateway into the instances' containers (oci runtime), or 'off'",
    )
    p.add_argument("--advertise-url", help="URL the control plane reaches the API at")
    p.add_argument("--hostname", default=socket.gethostname())
    p.add_argument("--region", default="", help="region code (default: the join token's)")
    p.add_argument(
        "--cpus",
        type=int,
        help="vCPUs offered to workloads (default: this machine's; sim: 16 per GPU)",
    )
    p.add_argument(
        "--memory-mib",
        type=int,
        help="RAM offered to workloads in MiB (default: this machine's; sim: 128 GiB per GPU)",
    )
    p.add_argument(
        "--unbounded-layers",
        action="store_true",
        help="oci: run containers even where the engine cannot bound their writable layer",
    )
    p.add_argument(
        "--images-disk",
        type=_percents,
        default=(DISK_HIGH_PERCENT, DISK_LOW_PERCENT),
        metavar="HIGH:LOW",
        help="oci: when the engine's disk is HIGH%% full, remove the images the agent pulled "
        "that nothing uses or pre-pulls, least recently launched first, until LOW%% "
        f"(default {DISK_HIGH_PERCENT}:{DISK_LOW_PERCENT}, as kubelet)",
    )
    p.add_argument("--state-dir", type=Path, default=Path("/var/lib/gpucloud-agent"))
    p.add_argument(
        "--sample-interval",
        type=_seconds,
        help=f"seconds (default: the server's, or {DEFAULT_SAMPLE_INTERVAL})",
    )
    p.add_argument(
        "--heartbeat-interval",
        type=_seconds,
        help=f"seconds (default: the server's, or {DEFAULT_HEARTBEAT_INTERVAL})",
    )
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")
    p.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=os.environ.get("LOG_FORMAT") or "text",
        help="one JSON object a line (default: LOG_FORMAT, else text)",
    )
    return p


def _split_listen(parser: argparse.ArgumentParser, listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    try:
        port = integers.parse(port, maximum=65535)
    except integers.NotAWholeNumber:
        host = ""
    if not host:
        parser.error(f"--listen must be HOST:PORT, not {listen!r}")
    return host.strip("[]"), port


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = _parser()
    args = parser.parse_args(argv)
    args.servers = [url.strip() for given in args.server for url in given.split(",") if url.strip()]
    if bool(args.servers) == bool(args.secret):
        parser.error("give --server (and --join-token) to register, or --secret to run standalone")
    args.modes = args.mode.split(",") if args.mode else None
    for mode in args.modes or ():
        if mode not in MODES:
            parser.error(f"unknown mode {mode!r}: choose from {', '.join(MODES)}")
    if args.backend == "sim":
        if args.gpus is None:
            parser.error("the sim backend needs --gpus N (how many GPUs to simulate)")
        if args.gpus < 1:
            parser.error("--gpus must be at least 1")
        modes = args.modes or ["whole"]
        if len(modes) not in (1, args.gpus):
            parser.error(f"--mode lists {len(modes)} modes for {args.gpus} GPUs")
        args.modes = modes * args.gpus if len(modes) == 1 else modes
        if "mig" in args.modes and not MODELS[args.model].mig_profiles:
            parser.error(f"{args.model} has no MIG")
    args.listen_host, args.listen_port = _split_listen(parser, args.listen)
    args.ssh = None if args.ssh_listen == "off" else _split_listen(parser, args.ssh_listen)
    if not args.advertise_url:
        host = args.listen_host
        if host in ("0.0.0.0", "::", ""):
            host = args.hostname
        elif ":" in host:
            host = f"[{host}]"
        args.advertise_url = f"http://{host}:{args.listen_port}"
    return args


def main(argv: list[str] | None = None) -> None:
    words = sys.argv[1:] if argv is None else argv
    if words[:1] == ["probe"]:  # read-only report of this host: agent/probe.py
        from agent.probe import main as probe

        sys.exit(probe(words[1:]))
    args = _parse(argv)
    # What the agent and the programs it starts (restic, mkfs …) make is root's alone: its
    # identity, host key, disks, logs, restic's cache (agent/state.py)
    os.umask(PRIVATE_UMASK)
    logs.configure(args.log_level, args.log_format)
    store = StateStore(args.state_dir)
    if args.backend == "sim":
        backend = SimBackend(args.hostname, MODELS[args.model], args.modes)
    else:
        try:
            backend = NvmlBackend(args.modes, args.manage_mig)
        except (ValueError, pynvml.NVMLError) as exc:
            sys.exit(f"gpucloud-agent: NVML: {exc}")
    if args.runtime == "oci":
        try:
            runtime = OciRuntime(
                args.engine_url,
                store.log_dir,
                args.stop_grace,
                install=store.install_id(),
                egress=args.egress,
                cdi=args.backend == "nvml",
                mps_dir=args.state_dir / "mps" if args.backend == "nvml" else None,
                gpus=len(backend.gpus()),
                unbounded_layers=args.unbounded_layers,
                images_disk=args.images_disk,
            )
        except DockerException as exc:
            sys.exit(f"gpucloud-agent: container engine: {exc}")
        except FirewallError as exc:
            sys.exit(f"gpucloud-agent: firewall (nftables, as root): {exc}")
    elif args.runtime == "process":
        runtime = ProcessRuntime(store.log_dir, args.stop_grace)
    else:
        runtime = SimRuntime()
    if args.backend == "sim":
        if args.runtime != "sim":
            backend.follow_cpu(runtime.cpu_seconds)
        cpus, memory = sim_capacity(args.gpus)
        args.cpus, args.memory_mib = args.cpus or cpus, args.memory_mib or memory
    host = LocalHost(args.hostname, backend, runtime, store, args.cpus, args.memory_mib)
    host.restore()
    gateway = None
    if args.ssh and args.runtime == "oci":
        gateway = Gateway(host, args.state_dir, *args.ssh)

    reporter = None
    secret = HostSecret(args.secret) if args.secret else None
    sample_interval = args.sample_interval or DEFAULT_SAMPLE_INTERVAL
    if args.servers:
        servers = Servers(args.servers)
        registration = {
            "hostname": args.hostname,
            "address": args.advertise_url,
            "region": args.region,
            "inventory": host.inventory(),
        }
        try:
            identity = ensure_identity(store, servers, args.join_token, registration)
        except RegistrationError as exc:
            sys.exit(f"gpucloud-agent: {exc}")
        secret = HostSecret.of_identity(store, identity)
        sample_interval = (
            args.sample_interval or identity["sample_interval"] or DEFAULT_SAMPLE_INTERVAL
        )
        heartbeat_interval = (
            args.heartbeat_interval or identity["heartbeat_interval"] or DEFAULT_HEARTBEAT_INTERVAL
        )
        reporter = Reporter(host, identity, heartbeat_interval, args.advertise_url, servers, secret)
        host.listeners.append(reporter.add_event)

    app = create_app(host, secret, lifespan(host, sample_interval, reporter, gateway))
    serve(app, args.listen_host, args.listen_port, args.log_level)
    if isinstance(runtime, OciRuntime) and runtime.networks.release():
        log.info("stopped with no container running: the firewall's chains are removed")


if __name__ == "__main__":
    main()
