"""Browser terminal latency: a keystroke sent on the console's /ws/instances/{id}/terminal/
until its echo comes back, through the real stack (uvicorn, the console's relay, the host
agent's terminal websocket, an exec with a PTY in a Podman container).

Starts, in a throwaway directory: an embedded Redis-protocol server, a SQLite database
(migrated here, with a minimal catalog), uvicorn, a Celery worker, Podman's API and one host
agent with the `oci` runtime, then one running instance of the demo image. The baseline,
measured in the same run, is the same keystrokes straight to the agent's terminal websocket
(no console in between).

    .venv/bin/python bench/terminal.py              # 300 keystrokes each way
    .venv/bin/python bench/terminal.py -n 1000
"""

import argparse
import asyncio
import contextlib
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scratch import scratch_var_dir  # noqa: E402 - bench/ is on the path as a script
from stats import percentile  # noqa: E402 - bench/ is on the path when run as a script

KEY = b"x"
CLEAR_LINE = b"\x15"  # Ctrl-U: the shell forgets the typed line


async def keystrokes(url: str, headers: dict, count: int) -> list[float]:
    """Seconds from sending each keystroke to reading its echo."""
    import websockets

    async with websockets.connect(url, additional_headers=headers) as ws:
        await ws.send(b"echo ready\r")
        seen = b""
        while b"ready\r\n" not in seen:
            seen += await asyncio.wait_for(ws.recv(), 10)
        await drain(ws)  # the prompt and its cursor query
        times = []
        for i in range(count):
            started = time.perf_counter()
            await ws.send(KEY)
            echoed = b""
            while KEY not in echoed:
                echoed += await asyncio.wait_for(ws.recv(), 10)
            times.append(time.perf_counter() - started)
            if i % 50 == 49:
                await ws.send(CLEAR_LINE)
                await drain(ws)
        return times


async def drain(ws, quiet: float = 0.2) -> None:
    """Read until the shell has said nothing for `quiet` seconds."""
    with contextlib.suppress(TimeoutError):
        while True:
            await asyncio.wait_for(ws.recv(), quiet)


def row(name: str, values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return (
        f"| {name:<40} | {len(ms):>5} | {percentile(ms, 50):>7.2f} | {percentile(ms, 99):>7.2f} "
        f"| {max(ms):>7.2f} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--keystrokes", type=int, default=300)
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs)")
    args = parser.parse_args()

    tmp = scratch_var_dir("gpucloud-bench-terminal-")
    os.environ["DATABASE_URL"] = ""
    import django

    from console import state_dir

    state_dir.prepare()
    django.setup()
    from django.core.management import call_command

    from accounts import services as accounts
    from agent.devtools import engine
    from console import processes
    from tests.harness import Stack
    from tests.instances.e2e import api_client, make_catalog, make_tenant, start_agent
    from tests.instances.e2e import wait_state as wait_api_state

    call_command("migrate", verbosity=0)
    podman = engine.start_podman_service(tmp / "podman.sock", tmp / "podman.log")
    engine.build_demo_image()
    stack = Stack(processes.start_embedded_redis(), tmp)
    try:
        make_catalog()
        from tests.factories import ImageFactory

        ImageFactory(name="demo", reference=engine.DEMO_IMAGE, command=["sleep", "3600"])
        _, membership = make_tenant()
        _, host = start_agent(
            stack, "bench-gpu", runtime="oci", engine_url=f"unix://{tmp / 'podman.sock'}"
        )
        api = api_client(stack, membership)
        created = api.post(
            "/instances/", json={"name": "tty", "spec": "a100-quarter", "image": "demo"}
        )
        created.raise_for_status()
        iid = created.json()["id"]
        wait_api_state(api, iid, "running", stack)
        raw = accounts.issue_token(membership.user, membership.tenant, "bench").raw

        console = asyncio.run(
            keystrokes(
                f"ws://127.0.0.1:{stack.port}/ws/instances/{iid}/terminal/",
                {"Authorization": f"Bearer {raw}"},
                args.keystrokes,
            )
        )
        agent_ws = host.address.replace("http://", "ws://").rstrip("/")
        direct = asyncio.run(
            keystrokes(
                f"{agent_ws}/v1/instances/{iid}/terminal?cols=80&rows=24",
                {"Authorization": f"Bearer {host.secret}"},
                args.keystrokes,
            )
        )
        api.post(f"/instances/{iid}/terminate/").raise_for_status()
        wait_api_state(api, iid, "terminated", stack)  # its container and volume go with it
    finally:
        stack.stop()
        podman.terminate()
        podman.wait(10)
        if args.keep:
            print(f"logs in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    print()
    print(
        f"gpucloud terminal bench: {args.keystrokes} keystrokes one at a time, each waiting for "
        f"its echo; demo image on Podman, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
    )
    print()
    print(f"| {'what':<40} |     n |  p50 ms |  p99 ms |  max ms |")
    print(f"|{'-' * 42}|-------|---------|---------|---------|")
    print(row("agent terminal websocket (baseline)", direct))
    print(row("console /ws/instances/{id}/terminal/", console))
    print()
    verdict = "met" if percentile(console, 99) < 0.05 else "MISSED"
    print(f"target keystroke → echo p99 < 50 ms through the console: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
