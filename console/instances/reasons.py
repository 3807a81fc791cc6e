"""Why an instance is in its state, in words: the one place that turns a state reason code
into a sentence saying what happened and what to do. The instance page, the list, the API
(``reason_text``) and the CLI (which prints the API's field) all say it this way.

A state reason (`Reason`) is either a code (`Code`), alone or with a detail (``oom_killed``;
``image_pull_failed`` with ``ghcr.io/x: manifest unknown``, set by the agents and by
outcomes.py, recovery.py, tasks.py, the idle watch and billing's budget stop), or, without a
code, words already (why a pending instance waits, a start's progress): those are shown as
they are. The instance keeps the two in two columns; the API's ``state_reason`` is
`Reason.text`. tests/instances/test_reasons.py checks that every code has a sentence here and
that every code the agents send is one."""

import re
from collections.abc import Callable
from dataclasses import dataclass

from django.db import models

# What an agent sends: "code" or "code: detail", or "exit code 3" (a failure without a code).
_CODED = re.compile(r"(?P<code>[a-z]+(?:_[a-z]+)*)(?:: ?(?P<detail>.*))?", re.DOTALL)
_EXIT_CODE = re.compile(r"exit code (?P<detail>-?[0-9]+)")


class Code(models.TextChoices):
    # the workload ended by itself
    EXITED = "exited"
    EXIT_CODE = "exit_code"
    EXIT_STATUS_UNKNOWN = "exit_status_unknown"
    OOM_KILLED = "oom_killed"
    GPU_MEMORY_CAP = "gpu_memory_cap"
    CONTAINER_LOST = "container_lost"
    # the workload never started
    COMMAND_NOT_FOUND = "command_not_found"
    IMAGE_NOT_FOUND = "image_not_found"
    IMAGE_PULL_FAILED = "image_pull_failed"
    REGISTRY_UNREACHABLE = "registry_unreachable"
    REGISTRY_NEEDS_CREDENTIALS = "registry_needs_credentials"
    REGISTRY_REFUSED_CREDENTIALS = "registry_refused_credentials"
    LAUNCH_FAILED = "launch_failed"
    ENGINE_UNAVAILABLE = "engine_unavailable"
    DISK_FAILED = "disk_failed"
    VOLUME_FOREIGN = "volume_foreign"
    VOLUME_BUSY = "volume_busy"
    # its host, its GPU, its slice
    GPU_LOST = "gpu_lost"
    GPU_MISSING = "gpu_missing"
    MIG_DEVICE_MISSING = "mig_device_missing"
    AGENT_RESTARTED = "agent_restarted"
    ALLOCATION_LOST = "allocation_lost"
    ALLOCATION_VANISHED = "allocation_vanished"
    AGENT_REPORTED = "agent_reported"
    AGENT_UNAVAILABLE = "agent_unavailable"
    AGENT_REJECTED = "agent_rejected"
    INTERNAL_ERROR = "internal_error"
    HOST_UNREACHABLE = "host_unreachable"
    ENGINE_DOWN = "engine_down"
    HOST_LOST = "host_lost"
    # billing
    BUDGET_STOPPED = "budget_stopped"
    # the idle policies (console.idle)
    IDLE_STOPPED = "idle_stopped"
    RUNTIME_LIMIT = "runtime_limit"  # at an idle policy's maximum runtime


# Stops whose reason the stopped instance keeps (a tenant's own stop clears it).
KEPT_ON_STOP = (Code.BUDGET_STOPPED, Code.IDLE_STOPPED, Code.RUNTIME_LIMIT)
# The longest reason, as one line (`Reason.text`), an instance keeps.
MAX_TEXT = 200


@dataclass(frozen=True)
class Reason:
    """Why an instance is in its state: a `Code` with its detail, or (code "") words."""

    code: str = ""
    detail: str = ""

    @property
    def text(self) -> str:
        """As one line, as the API's ``state_reason`` says it: "code", "code: detail", the
        agents' "exit code 3", or the words."""
        if self.code == Code.EXIT_CODE:
            return f"exit code {self.detail}"
        if self.code and self.detail:
            return f"{self.code}: {self.detail}"
        return self.code or self.detail

    def fitted(self) -> "Reason":
        """This reason, its detail shortened (at a word's end) so that its text is at most
        MAX_TEXT long."""
        room = MAX_TEXT - (len(self.text) - len(self.detail))
        return Reason(self.code, shorten(self.detail, max(room, 0)))


ELLIPSIS = "…"


def shorten(text: str, limit: int) -> str:
    """`text` in at most `limit` characters: as it is when it fits, else cut at the end of a
    word with "…" (mid-word only when its first word alone is longer)."""
    if len(text) <= limit:
        return text
    if limit <= len(ELLIPSIS):
        return text[:limit]
    cut = text[: limit - len(ELLIPSIS) + 1]
    cut = cut[: cut.rstrip().rfind(" ")] if " " in cut.strip() else cut[:-1]
    return cut.rstrip(" ,;:(") + ELLIPSIS


def from_agent(text: str) -> Reason:
    """The reason an agent sends as text ("code: detail", "exit code 3", words)."""
    if found := _EXIT_CODE.fullmatch(text):
        return Reason(Code.EXIT_CODE, found["detail"])
    found = _CODED.fullmatch(text)
    if found and found["code"] in Code.values:
        return Reason(Code(found["code"]), found["detail"] or "")
    return Reason(detail=text)


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
DEFAULT_ENGINE_DOWN = "its host's container engine does not answer"
OPERATOR = "if it happens again, tell your operator"

REASONS: dict[Code, Callable[[Facts], str]] = {
    # the workload ended by itself
    Code.EXITED: lambda f: f"its workload exited by itself{_exit(f)} — {AGAIN} to run it once more",
    Code.EXIT_CODE: lambda f: (
        f"its workload exited with code {f.detail or f.exit_code} — read its logs for the "
        f"error, then {AGAIN}"
    ),
    Code.EXIT_STATUS_UNKNOWN: lambda f: (
        f"its workload ended, but its host could not tell the exit code — read its logs; "
        f"{AGAIN} to run it once more"
    ),
    Code.OOM_KILLED: lambda f: f"ran out of {_memory(f)} — choose a larger spec (resize it)",
    Code.GPU_MEMORY_CAP: lambda f: (
        f"used more than {_gpu_memory(f)} and was stopped — choose a spec with more GPU "
        "memory (resize it)"
    ),
    Code.CONTAINER_LOST: lambda f: (
        f"its container disappeared from its host{f.said} — {AGAIN}; its disk is kept"
    ),
    # the workload never started
    Code.COMMAND_NOT_FOUND: lambda f: (
        f"its command is not in the image{f.said} — fix the command or choose another image"
    ),
    Code.IMAGE_NOT_FOUND: lambda f: (
        f"its image was not found{f.said} — check the reference for a typo (registry, "
        "repository and tag), or choose another image"
    ),
    Code.IMAGE_PULL_FAILED: lambda f: (
        f"its image could not be downloaded{f.said} — check the reference and its registry; "
        f"{OPERATOR}"
    ),
    # the agent's detail names the registry and the engine's error (agent/image_store.py)
    Code.REGISTRY_UNREACHABLE: lambda f: (
        f"its image's registry could not be reached{f.said} — the hosts cannot reach that "
        "registry: ask your operator for a registry mirror or for network access to it, or "
        "push the image to a registry the region allows"
    ),
    Code.REGISTRY_NEEDS_CREDENTIALS: lambda f: (
        f"{f.detail or 'its image registry asks for credentials'} — add them under Registry "
        f"credentials (an admin of your tenant can), or check the reference for a typo, then "
        f"{AGAIN}"
    ),
    Code.REGISTRY_REFUSED_CREDENTIALS: lambda f: (
        f"{f.detail or 'its image registry refused the credentials'} — check the username and "
        f"token under Registry credentials, then {AGAIN}"
    ),
    Code.LAUNCH_FAILED: lambda f: (
        f"its workload could not be started{f.said} — {AGAIN}; {OPERATOR}"
    ),
    Code.ENGINE_UNAVAILABLE: lambda f: (
        f"its host's container engine did not answer{f.said} — {AGAIN} in a moment; {OPERATOR}"
    ),
    Code.DISK_FAILED: lambda f: f"its disk could not be prepared{f.said} — {AGAIN}; {OPERATOR}",
    Code.VOLUME_FOREIGN: lambda f: (
        f"its host holds a disk of that name made for something else{f.said}, so it was not "
        "used — tell your operator"
    ),
    Code.VOLUME_BUSY: lambda f: (
        f"a disk of it is held by another running instance{f.said} — stop that one, then {AGAIN}"
    ),
    # its host, its GPU, its slice
    Code.GPU_LOST: lambda f: f"its GPU failed on its host — {AGAIN} to run on a healthy GPU",
    Code.GPU_MISSING: lambda f: (
        f"its GPU was gone when its host's agent restarted — {AGAIN} to run on another GPU"
    ),
    Code.MIG_DEVICE_MISSING: lambda f: (
        f"its MIG slice could not be made again when its host's agent restarted — {AGAIN}"
    ),
    Code.AGENT_RESTARTED: lambda f: (
        f"its host's agent restarted and its workload did not survive — {AGAIN}; its disk is kept"
    ),
    Code.ALLOCATION_LOST: lambda f: f"its host lost its GPU slice{f.said} — {AGAIN}",
    Code.ALLOCATION_VANISHED: lambda f: (
        f"its GPU slice was no longer on its host{f.said} — {AGAIN}"
    ),
    Code.AGENT_REPORTED: lambda f: (
        f"its host reported a failure without saying why — read its logs, then {AGAIN}"
    ),
    Code.AGENT_UNAVAILABLE: lambda f: (
        f"its host did not answer{f.said} — {AGAIN}; it goes to a host that answers"
    ),
    Code.AGENT_REJECTED: lambda f: f"its host refused the request{f.said} — {AGAIN}; {OPERATOR}",
    Code.INTERNAL_ERROR: lambda f: f"the console failed to handle it{f.said} — {AGAIN}; {OPERATOR}",
    Code.HOST_UNREACHABLE: lambda f: (
        f"its host stopped answering{f.said}; it may still run there and comes back by itself "
        "if so — wait, or terminate it"
    ),
    Code.ENGINE_DOWN: lambda f: (
        f"its workload cannot be reached: {f.detail or DEFAULT_ENGINE_DOWN}"
        "; it may still run, and is not billed as running meanwhile — if the engine still runs "
        "it when it answers again, it is running again and billed for the outage too (the "
        "engine vouches that it ran); if it died with the engine, its restart policy applies "
        "and the outage stays unbilled"
    ),
    Code.HOST_LOST: lambda f: (
        f"its host was lost{f.said} — start it again when the host returns, or terminate it"
    ),
    # billing
    Code.BUDGET_STOPPED: lambda f: (
        f"stopped: {f.detail or 'its tenant spent its monthly budget'} — an owner can raise the "
        "budget on the Usage page, then start it again"
    ),
    # the idle policies (console.idle)
    Code.IDLE_STOPPED: lambda f: (
        f"stopped by the idle policy{f.said} — start it again when you need it"
    ),
    Code.RUNTIME_LIMIT: lambda f: (
        f"stopped at the idle policy's maximum runtime{f.said} — start it again when you need it"
    ),
}


def explain(
    reason: Reason | None,
    *,
    ram_mib: int | None = None,
    gpu_memory_mib: int | None = None,
    exit_code: int | None = None,
) -> str:
    """The sentence for a state reason ("" for none); words without a code are answered as
    they are."""
    if reason is None:
        return ""
    if not reason.code:
        return reason.detail
    facts = Facts(reason.detail.strip(), ram_mib, gpu_memory_mib, exit_code)
    text = REASONS[reason.code](facts)
    if facts.detail and text.startswith(facts.detail):  # a registry's name keeps its case
        return text + "."
    return text[:1].upper() + text[1:] + "."


def of_instance(instance) -> str:
    """`explain` for an Instance (its spec loaded)."""
    spec = instance.spec
    return explain(
        instance.reason,
        ram_mib=spec.ram_mib,
        gpu_memory_mib=spec.gpu_memory_mib,
        exit_code=instance.exit_code,
    )


def budget_stopped(budget_text: str, spent_text: str) -> Reason:
    """The state reason of an instance stopped at its tenant's budget (money as billing
    formats it)."""
    return Reason(Code.BUDGET_STOPPED, f"monthly budget of {budget_text} reached at {spent_text}")
