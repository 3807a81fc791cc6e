"""`gpucloud-agent probe`: what the agent can read on this host, and what it would offer.

Read-only: it reads NVML (and asks whether DCGM's host engine answers) and never creates,
destroys or changes anything: no MIG instance, no GPU setting, no DCGM watch. Run it as the
user the agent will run as, before joining the host: it prints the driver and CUDA versions,
each GPU with its model key, memory, MIG mode and MIG devices (profile, start, UUID), which
NVML readings are supported, unsupported or refused for lack of privilege, and what the agent
would offer the console, and the container engine the `oci` runtime would use (kind, version)
with how it would hand GPUs to containers (CDI devices, or the NVIDIA runtime's device
requests), whether its containers get user namespaces of their own and bounded writable
layers, what a restart of the engine would do to them (Docker's live-restore), and whether
nftables can be used. A host where NVML cannot be used (no GPU yet, a demo host) gets all but
the GPUs, and exit status 1. `--json` prints the same as one JSON document.
"""

import argparse
import json
import logging
import shutil
import sys

from agent import firewall
from agent.backends import nvml as nvml_backend
from agent.backends.nvml import dcgm as nvml_dcgm
from agent.backends.nvml.access import GRANT_HINT
from agent.gpu_models import MODELS, mig_profiles
from agent.runtimes.oci import describe_engine

NOTHING_CHANGES = "read-only: nothing on this host is created, destroyed or changed"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpucloud-agent probe",
        description="Print what the agent can read on this host's GPUs and what it would offer "
        f"the console ({NOTHING_CHANGES}).",
    )
    p.add_argument("--json", action="store_true", help="one JSON document instead of text")
    p.add_argument(
        "--engine-url", help="the container engine's API (default: Podman's sockets, then Docker's)"
    )
    return p


def _readings(outcomes: dict[str, str]) -> dict:
    kinds: dict[str, list | dict] = {
        "supported": [],
        "unsupported": [],
        "refused": [],
        "failed": {},
    }
    for key in sorted(outcomes):
        outcome = outcomes[key]
        if outcome == "ok":
            kinds["supported"].append(key)
        elif outcome == "unsupported":
            kinds["unsupported"].append(key)
        elif outcome == "no permission":
            kinds["refused"].append(key)
        else:
            kinds["failed"][key] = outcome.removeprefix("error: ")
    return kinds


def _slot(device: dict) -> str:
    return "an unreadable slot" if device["start"] is None else f"slot {device['start']}"


def _offer(gpu: dict) -> str:
    """What the agent would offer the console for one GPU, in words."""
    if not gpu["healthy"]:
        return f"nothing while it is unhealthy ({gpu['health_reason']})"
    model = gpu["model"]
    known = ""
    if model not in MODELS:
        known = (
            f"; model {model!r} is not one the agent knows ({', '.join(sorted(MODELS))}): the "
            "console registers it only if its catalog has that model"
        )
    if gpu["mode"] == "whole":
        return f"the whole GPU (whole mode){known}"
    if gpu["mode"] == "shared":
        memory = gpu["memory_mib"]
        cap = f", memory caps up to {memory} MiB" if memory else ""
        return f"fractions of 1000 milli-GPU (shared mode){cap}{known}"
    profiles = mig_profiles(model)
    if not profiles:
        return f"no MIG profile: the agent knows none for model {model!r}{known}"
    live = [d for d in gpu["mig_devices"] if d["uuid"] is not None]
    usable = [d for d in live if d["profile"] in profiles]
    where = ", ".join(f"{d['profile']} at {_slot(d)}" for d in usable)
    text = f"MIG profiles {', '.join(profiles)} on 8 memory slots"
    if usable:
        text += f"; existing devices usable for allocations: {where}"
    return text


def _warnings(backend, gpus: list[dict], dcgm_line: str) -> list[str]:
    warnings = []
    for index, refused in sorted(backend.mig_refused.items()):
        warnings.append(
            f"GPU {index}: NVML refuses {', '.join(refused)} for lack of MIG privileges: the start "
            "slot of MIG devices cannot be read (they are matched by slice count and memory) and "
            f"GPU instances without a compute instance cannot be found. To fix: {GRANT_HINT}"
        )
    if backend.mig_gpus:
        if backend.mig_refused or backend.access.may("config") is False:
            warnings.append(
                "--manage-mig would be refused: creating and destroying MIG instances needs "
                "the mig/config capability (or root)"
            )
        if not dcgm_line.startswith("DCGM: host engine"):
            warnings.append(
                "MIG devices will show no utilization (NVML has none for MIG; DCGM's "
                f"profiling fields would give it): {dcgm_line}"
            )
    for gpu in gpus:
        for device in gpu["mig_devices"]:
            if device["uuid"] is None:
                warnings.append(
                    f"GPU {gpu['index']}: GPU instance {device['gpu_instance_id']} "
                    f"({device['profile']} at slot {device['start']}) has no compute instance: "
                    f"it holds its slots; destroy it (nvidia-smi mig -i {gpu['index']} -gi "
                    f"{device['gpu_instance_id']} -dgi) or give it one"
                )
        if gpu["mig_pending"] is not None and gpu["mig_pending"] != gpu["mig_enabled"]:
            state = "enabled" if gpu["mig_pending"] else "disabled"
            warnings.append(
                f"GPU {gpu['index']}: MIG will be {state} after the next GPU reset; the agent "
                "reports the current mode"
            )
        if gpu["model"] not in MODELS and gpu["uuid"] is not None:
            warnings.append(
                f"GPU {gpu['index']}: model {gpu['model']!r} is unknown to the agent; the "
                "console refuses the host unless its catalog has it"
            )
        if not gpu["healthy"]:
            warnings.append(f"GPU {gpu['index']} is unhealthy: {gpu['health_reason']}")
    return warnings


def host_checks(engine_url: str | None) -> dict:
    """What the probe reads of the host besides its GPUs, read-only: the container engine
    (agent/runtimes/oci.py's describe_engine) and nftables (agent/firewall.py's check)."""
    nftables, usable = firewall.check()
    return {"engine": describe_engine(engine_url), "nftables": nftables, "nftables_ok": usable}


def _host_part(host: dict) -> dict:
    engine = host["engine"]
    warnings = engine["warnings"] + _engine_warnings(engine["gpu_path"])
    if not host["nftables_ok"]:
        warnings.append(f"nftables: {host['nftables']}")
    return {
        "engine": engine,
        "gpu_path": engine["gpu_path"],
        "nftables": host["nftables"],
        "warnings": warnings,
    }


def collect(backend, dcgm_line: str, host: dict) -> dict:
    """The probe's report from a backend (which it only reads) and the host's other checks
    (host_checks)."""
    gpus = backend.gpus()
    backend.sample([])  # the metric readings, for their outcomes
    nvml_version = nvml_backend.Reads().get(nvml_backend.pynvml.nvmlSystemGetNVMLVersion)
    rest = _host_part(host)
    return {
        "read_only": True,
        "nvml": "ok",
        "driver_version": backend.driver_version,
        "cuda_version": backend.cuda_version,
        "nvml_version": nvml_backend._text(nvml_version),
        "privileges": backend.access.describe(),
        "dcgm": dcgm_line,
        **rest,
        "gpus": [
            {
                **gpu,
                "readings": _readings(backend.readings.get(gpu["index"], {})),
                "offer": _offer(gpu),
            }
            for gpu in gpus
        ],
        "warnings": _warnings(backend, gpus, dcgm_line) + rest["warnings"],
    }


def collect_without_gpus(nvml_error: str, host: dict) -> dict:
    """The report of a host where NVML cannot be used (no NVIDIA driver, no GPU): what the
    agent would find of the rest, for a host that runs simulated GPUs (--backend sim) or that
    is being made ready before its GPUs are."""
    rest = _host_part(host)
    return {
        "read_only": True,
        "nvml": f"NVML cannot be used on this host: {nvml_error}",
        **rest,
        "gpus": [],
        "warnings": rest["warnings"],
    }


def _engine_warnings(path: str | None) -> list[str]:
    if path == "nvidia" and shutil.which("nvidia-container-runtime-hook") is None:
        return [
            "Docker has no CDI here and the NVIDIA Container Toolkit's runtime hook is not "
            "installed: containers would get no GPU (install nvidia-container-toolkit, or turn "
            'on Docker\'s CDI: "features": {"cdi": true} in daemon.json, Docker 25+)'
        ]
    return []


def _dcgm_line() -> str:
    reader, line = nvml_dcgm.connect()
    if reader is not None:
        reader.close()
    return line


def _device_line(device: dict) -> str:
    start = "?" if device["start"] is None else device["start"]
    size = "?" if device["size"] is None else device["size"]
    memory = f"{device['memory_mib']} MiB" if device["memory_mib"] is not None else "? MiB"
    what = device["uuid"] or "orphan: no compute instance"
    return (
        f"    {device['profile'] or '?':<12} start {start:<2} size {size:<2} {memory:>10}  "
        f"GPU instance {device['gpu_instance_id']}  {what}"
    )


def _reading_lines(readings: dict) -> list[str]:
    """The GPU's readings, then its MIG devices' (keys "MIG device: <call>")."""
    prefix = "MIG device: "
    lines = []
    for who, mine in (("", lambda k: not k.startswith(prefix)), ("MIG devices ", None)):
        for label, key in (
            ("supported", "supported"),
            ("unsupported", "unsupported"),
            ("refused (no permission)", "refused"),
        ):
            calls = [
                call.removeprefix(prefix)
                for call in readings[key]
                if (mine(call) if mine else call.startswith(prefix))
            ]
            if calls:
                lines.append(f"    {who}{label}: {', '.join(calls)}")
    for call, error in readings["failed"].items():
        lines.append(f"    failed: {call} ({error})")
    return lines


def _engine_lines(report: dict) -> list[str]:
    engine = report["engine"]
    lines = [engine["line"]]
    if "kind" in engine:
        lines.append(f"  user namespaces: {engine['user_namespaces']}")
        lines.append(f"  writable layers: {engine['writable_layers']}")
        lines.append(f"  engine restart: {engine['restart']}")
    lines.append(f"nftables: {report['nftables']}")
    return lines


def render(report: dict) -> str:
    lines = [f"gpucloud-agent probe ({NOTHING_CHANGES})", ""]
    if report["nvml"] != "ok":
        lines += [f"GPUs: {report['nvml']}", *_engine_lines(report), ""]
        lines += ["Warnings:" if report["warnings"] else "No warnings."]
        return "\n".join(lines + [f"  - {warning}" for warning in report["warnings"]])
    lines.append(
        f"NVIDIA driver {report['driver_version'] or '?'}, CUDA {report['cuda_version'] or '?'}, "
        f"NVML {report['nvml_version'] or '?'}, {len(report['gpus'])} GPU(s)"
    )
    lines.append(f"privileges: {report['privileges']}")
    lines.append(report["dcgm"])
    lines += _engine_lines(report)
    for gpu in report["gpus"]:
        lines += ["", f"GPU {gpu['index']}: {gpu['name'] or '?'}"]
        lines.append(f"  uuid {gpu['uuid'] or '?'}, PCI {gpu['pci_bus_id'] or '?'}")
        memory = f"{gpu['memory_mib']} MiB" if gpu["memory_mib"] is not None else "unreadable"
        health = "healthy" if gpu["healthy"] else f"UNHEALTHY: {gpu['health_reason']}"
        lines.append(f"  model {gpu['model'] or '?'}, memory {memory}, {health}")
        if gpu["mig_pending"] is None and not gpu["mig_enabled"]:
            mig = "MIG not supported"
        else:
            pending = "enabled" if gpu["mig_pending"] else "disabled"
            mig = f"MIG {'enabled' if gpu['mig_enabled'] else 'disabled'} (pending: {pending})"
        lines.append(f"  {mig}; mode {gpu['mode']}")
        if gpu["mig_devices"]:
            lines.append("  MIG devices:")
            lines += [_device_line(device) for device in gpu["mig_devices"]]
        lines.append("  NVML readings:")
        lines += _reading_lines(gpu["readings"])
        lines.append(f"  offers: {gpu['offer']}")
    lines += ["", "Warnings:" if report["warnings"] else "No warnings."]
    lines += [f"  - {warning}" for warning in report["warnings"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    agent_log = logging.getLogger("agent")
    level = agent_log.level
    agent_log.setLevel(logging.ERROR)  # what the agent would warn about, the report says
    try:
        host = host_checks(args.engine_url)
        try:
            backend = nvml_backend.NvmlBackend(None, False, dcgm=None)
        except (ValueError, nvml_backend.pynvml.NVMLError) as exc:
            # the rest is reported all the same; the exit status says there is no GPU to offer
            report = collect_without_gpus(str(exc), host)
            print(json.dumps(report, indent=2) if args.json else render(report))
            print(f"gpucloud-agent probe: NVML cannot be used on this host: {exc}", file=sys.stderr)
            return 1
        try:
            report = collect(backend, _dcgm_line(), host)
        finally:
            backend.close()
    finally:
        agent_log.setLevel(level)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
