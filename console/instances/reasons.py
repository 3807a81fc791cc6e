"""Why an instance is in its state, in words: the one place that turns a state reason code
into a sentence saying what happened and what to do. The instance page, the list, the API
(``reason_text``) and the CLI (which prints the API's field) all say it this way.

A state reason is either a code, alone or with a detail after a colon
(``oom_killed``, ``image_pull_failed: ghcr.io/x: manifest unknown``, set by the agents and by
outcomes.py, recovery.py, tasks.py and billing's budget stop), or already a sentence (why a
pending instance waits, a start's progress): that one is shown as it is. tests/instances/
test_reasons.py collects every code the code base can set and checks that each has a
sentence here."""

import re
from collections.abc import Callable
from dataclasses import dataclass

# "code" or "code: detail"; also the agents' "exit code 3" (a failure without a code).
_CODED = re.compile(r"(?P<code>[a-z]+(?:_[a-z]+)*)(?:: ?(?P<detail>.*))?", re.DOTALL)
_EXIT_CODE = re.compile(r"exit code (?P<detail>-?[0-9]+)")

BUDGET_STOPPED = "budget_stopped"
IDLE_STOPPED = "idle_stopped"  # by an idle policy (console.idle)
RUNTIME_LIMIT = "runtime_limit"  # at an idle policy's maximum runtime
# Stops whose reason the stopped instance keeps (a tenant's own stop clears it).
KEPT_ON_STOP = (BUDGET_STOPPED, IDLE_STOPPED, RUNTIME_LIMIT)


@dataclass(frozen=True)
class Facts:
    """What a sentence may quote: the detail after the code, the instance's spec's figures,
    the workload's exit code."""

    detail: str = ""
    ram_mib: int | None = None
    gpu_memory_mib: int | None = None
    exit_code: int | None = None

    @property
    def said(self) -> str:
        """The detail in parentheses, or nothing."""
        return f" ({self.detail})" if self.detail else ""


def format_mib(value: int | None) -> str:
    """256 MiB, 32 GiB, 1.5 TiB: the largest unit that reads as a short number."""
    if not value:
        return "0 MiB"
    for unit, size in (("TiB", 1024 * 1024), ("GiB", 1024)):
        if value >= size and (value * 10) % size == 0:
            return f"{value / size:g} {unit}"
    return f"{value:,} MiB"


def _memory(facts: Facts) -> str:
    return f"its {format_mib(facts.ram_mib)} of memory" if facts.ram_mib else "its memory"


def _gpu_memory(facts: Facts) -> str:
    return (
        f"its {format_mib(facts.gpu_memory_mib)} of GPU memory"
        if facts.gpu_memory_mib
        else "its GPU memory"
    )


def _exit(facts: Facts) -> str:
    return f" with code {facts.exit_code}" if facts.exit_code is not None else ""


AGAIN = "start it again"
OPERATOR = "if it happens again, tell your operator"

REASONS: dict[str, Callable[[Facts], str]] = {
    # the workload ended by itself
    "exited": lambda f: f"its workload exited by itself{_exit(f)} — {AGAIN} to run it once more",
    "exit_code": lambda f: (
        f"its workload exited with code {f.detail or f.exit_code} — read its logs for the "
        f"error, then {AGAIN}"
    ),
    "exit_status_unknown": lambda f: (
        f"its workload ended, but its host could not tell the exit code — read its logs; "
        f"{AGAIN} to run it once more"
    ),
    "oom_killed": lambda f: f"ran out of {_memory(f)} — choose a larger spec (resize it)",
    "gpu_memory_cap": lambda f: (
        f"used more than {_gpu_memory(f)} and was stopped — choose a spec with more GPU "
        "memory (resize it)"
    ),
    "container_lost": lambda f: (
        f"its container disappeared from its host{f.said} — {AGAIN}; its disk is kept"
    ),
    # the workload never started
    "command_not_found": lambda f: (
        f"its command is not in the image{f.said} — fix the command or choose another image"
    ),
    "image_not_found": lambda f: (
        f"its image was not found{f.said} — check the image's name, or choose another image"
    ),
    "image_pull_failed": lambda f: (
        f"its image could not be downloaded{f.said} — {AGAIN} in a moment; {OPERATOR}"
    ),
    "launch_failed": lambda f: f"its workload could not be started{f.said} — {AGAIN}; {OPERATOR}",
    "engine_unavailable": lambda f: (
        f"its host's container engine did not answer{f.said} — {AGAIN} in a moment; {OPERATOR}"
    ),
    "disk_failed": lambda f: f"its disk could not be prepared{f.said} — {AGAIN}; {OPERATOR}",
    "volume_foreign": lambda f: (
        f"its host holds a disk of that name made for something else{f.said}, so it was not "
        "used — tell your operator"
    ),
    "volume_busy": lambda f: (
        f"a disk of it is held by another running instance{f.said} — stop that one, then {AGAIN}"
    ),
    # its host, its GPU, its slice
    "gpu_lost": lambda f: f"its GPU failed on its host — {AGAIN} to run on a healthy GPU",
    "gpu_missing": lambda f: (
        f"its GPU was gone when its host's agent restarted — {AGAIN} to run on another GPU"
    ),
    "mig_device_missing": lambda f: (
        f"its MIG slice could not be made again when its host's agent restarted — {AGAIN}"
    ),
    "agent_restarted": lambda f: (
        f"its host's agent restarted and its workload did not survive — {AGAIN}; its disk is kept"
    ),
    "allocation_lost": lambda f: f"its host lost its GPU slice{f.said} — {AGAIN}",
    "allocation_vanished": lambda f: f"its GPU slice was no longer on its host{f.said} — {AGAIN}",
    "agent_reported": lambda f: (
        f"its host reported a failure without saying why — read its logs, then {AGAIN}"
    ),
    "agent_unavailable": lambda f: (
        f"its host did not answer{f.said} — {AGAIN}; it goes to a host that answers"
    ),
    "agent_rejected": lambda f: f"its host refused the request{f.said} — {AGAIN}; {OPERATOR}",
    "internal_error": lambda f: f"the console failed to handle it{f.said} — {AGAIN}; {OPERATOR}",
    "host_unreachable": lambda f: (
        f"its host stopped answering{f.said}; it may still run there and comes back by itself "
        "if so — wait, or terminate it"
    ),
    "host_lost": lambda f: (
        f"its host was lost{f.said} — start it again when the host returns, or terminate it"
    ),
    # billing
    BUDGET_STOPPED: lambda f: (
        f"stopped: {f.detail or 'its tenant spent its monthly budget'} — an owner can raise the "
        "budget on the Usage page, then start it again"
    ),
    # the idle policies (console.idle)
    IDLE_STOPPED: lambda f: f"stopped by the idle policy{f.said} — start it again when you need it",
    RUNTIME_LIMIT: lambda f: (
        f"stopped at the idle policy's maximum runtime{f.said} — start it again when you need it"
    ),
}


def code_of(reason: str) -> str | None:
    """The code of a state reason, or None when it is a sentence already."""
    reason = reason or ""
    if _EXIT_CODE.fullmatch(reason):
        return "exit_code"
    found = _CODED.fullmatch(reason)
    return found["code"] if found and found["code"] in REASONS else None


def explain(
    reason: str,
    *,
    ram_mib: int | None = None,
    gpu_memory_mib: int | None = None,
    exit_code: int | None = None,
) -> str:
    """The sentence for a state reason ("" for none); a reason that is not a code already is
    one, and is answered as it is."""
    code = code_of(reason)
    if code is None:
        return reason or ""
    found = _EXIT_CODE.fullmatch(reason) or _CODED.fullmatch(reason)
    facts = Facts((found["detail"] or "").strip(), ram_mib, gpu_memory_mib, exit_code)
    text = REASONS[code](facts)
    return text[:1].upper() + text[1:] + "."


def of_instance(instance) -> str:
    """`explain` for an Instance (its spec loaded)."""
    spec = instance.spec
    return explain(
        instance.state_reason,
        ram_mib=spec.ram_mib,
        gpu_memory_mib=spec.gpu_memory_mib,
        exit_code=instance.exit_code,
    )


def budget_stopped(budget_text: str, spent_text: str) -> str:
    """The state reason of an instance stopped at its tenant's budget (money as billing
    formats it)."""
    return f"{BUDGET_STOPPED}: monthly budget of {budget_text} reached at {spent_text}"
