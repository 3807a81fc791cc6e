"""`gpucloud launch --wait`: follow a new instance until it runs or fails, printing each state
it passes through and each new reason within it, an image pull's progress included (on stderr,
so that stdout stays the table or JSON)."""

import sys
import time

from cli.errors import CliError

POLL_SECONDS = 0.5
# States a launch does not leave by itself: it will not run unless someone acts.
GAVE_UP = ("failed", "stopping", "stopped", "terminating", "terminated")


def reason(instance: dict) -> str:
    """Why the instance is in its state, in words where the API gives them."""
    return instance.get("reason_text") or instance.get("state_reason") or ""


def wait_until_running(client, instance: dict, timeout: float) -> dict:
    """The instance once running; CliError when it fails (with the reason) or when `timeout`
    seconds pass first."""
    deadline = time.monotonic() + timeout
    label = instance.get("name") or str(instance["id"])
    shown = None
    while True:
        state, why = instance["state"], reason(instance)
        if (state, why) != shown:
            shown = state, why
            print(f"{label}: {state}{f' ({why})' if why else ''}", file=sys.stderr, flush=True)
        if state == "running":
            return instance
        if state in GAVE_UP:
            raise CliError(f"{label} is {state}: {why or 'no reason given'}")
        if time.monotonic() >= deadline:
            raise CliError(
                f"{label} is still {state} after {timeout:g} s: follow it with "
                f"`gpucloud show {instance['id']}`"
            )
        time.sleep(POLL_SECONDS)
        instance = client.call("GET", f"instances/{instance['id']}/")
