"""Whether an instance is idle, and what the idle watch does about it: plain functions of plain
figures (times are epoch seconds), so that every case is a unit test.

An instance is idle when, over the rule's window, its GPU utilisation (its slice's: MIG device,
MPS client or whole GPU, as its samples say) stayed under the threshold and no SSH session,
terminal or port request was active, counting only the signals the rule turns on. It is then
warned (`warning_minutes` ahead) and acted on at the time the warning said, unless it was used
meanwhile or the tenant kept it running. The maximum runtime is warned of and acted on the same
way. `notify` has nothing to warn of: it tells once per idle stretch."""

from dataclasses import dataclass, field

from console.idle.rules import Rule

# Without a sample this recent the GPU cannot be judged (its agent went quiet): nothing is done.
STALE_SAMPLES_SECONDS = 30.0
IDLE, MAX_RUNTIME = "idle", "max_runtime"


@dataclass(frozen=True)
class Facts:
    """What is known of one running instance at `now`.

    - `running_since`: when this run began (console.instances.runs: an adoption, a reboot, a
      resize or a restart by the platform goes on with the same run).
    - `last_busy`: the last sample at or over the threshold (None: none in the stretch looked
      at, which reaches back beyond the window and its warning); `latest_sample`: the newest
      sample's time (None: none); `peak_util`: the highest utilisation in the window (the
      event's figure).
    - `sessions`: per signal (ssh, terminal, ports): (open now, last used or None).
    - `kept_at`, `kept_kind`: when the tenant kept it running in this run, and from what."""

    now: float
    running_since: float
    last_busy: float | None = None
    latest_sample: float | None = None
    peak_util: float | None = None
    sessions: dict[str, tuple[int, float | None]] = field(default_factory=dict)
    kept_at: float | None = None
    kept_kind: str = ""


@dataclass(frozen=True)
class Pending:
    """The watch's warning in this run: what for, when sent, when it acts; and when it last
    acted (None: never)."""

    kind: str = ""
    warned_at: float | None = None
    acts_at: float | None = None
    acted_at: float | None = None


@dataclass(frozen=True)
class Step:
    """What to do now: "wait", "warn" (acts at `acts_at`), "act", or "clear" (a warning no
    longer holds: the instance was used). `since` is when it went idle (or its run began, for
    the maximum runtime)."""

    what: str
    kind: str = ""
    acts_at: float | None = None
    since: float | None = None


WAIT = Step("wait")


def idle_since(rule: Rule, facts: Facts) -> float | None:
    """Since when the instance has been idle by this rule's signals; None while it is in use
    (a session open) or cannot be judged (no recent GPU sample)."""
    marks = [facts.running_since]
    if facts.kept_at is not None:
        marks.append(facts.kept_at)
    if rule.count_gpu:
        latest = facts.latest_sample
        if latest is None or latest < facts.now - STALE_SAMPLES_SECONDS:
            return None
        if facts.last_busy is not None:
            marks.append(facts.last_busy)
    for signal, (open_now, last_used) in facts.sessions.items():
        if not rule.counts(signal):
            continue
        if open_now:
            return None
        if last_used is not None:
            marks.append(last_used)
    return max(marks)


def _deadlines(rule: Rule, facts: Facts) -> list[tuple[float, str, float]]:
    """(when it acts if nothing changes, kind, since) of each part of the rule that applies."""
    lead = float(rule.warning_minutes) * 60
    found = []
    if rule.window_minutes is not None:
        since = idle_since(rule, facts)
        if since is not None:
            window = float(rule.window_minutes) * 60
            found.append((since + window + (0 if rule.action == "notify" else lead), IDLE, since))
    if rule.max_runtime_minutes is not None:
        start = facts.running_since
        if facts.kept_kind == MAX_RUNTIME and facts.kept_at is not None:
            start = facts.kept_at
        found.append((start + float(rule.max_runtime_minutes) * 60, MAX_RUNTIME, start))
    return found


def decide(rule: Rule, facts: Facts, pending: Pending) -> Step:
    """The watch's next step for one running instance."""
    now, lead = facts.now, float(rule.warning_minutes) * 60
    deadlines = sorted(_deadlines(rule, facts))
    if not deadlines:
        return Step("clear") if pending.warned_at is not None else WAIT
    due, kind, since = deadlines[0]
    if pending.acted_at is not None and since <= pending.acted_at:
        return WAIT  # done for this stretch (notify) or this run
    if pending.warned_at is not None:
        if pending.kind != kind or since > pending.warned_at:
            return Step("clear", kind)  # used (or kept running) since the warning
        if now >= pending.acts_at:
            return Step("act", kind, pending.acts_at, since)
        return WAIT
    if rule.action == "notify" and kind == IDLE:
        return Step("act", kind, due, since) if now >= due else WAIT
    if now >= due - lead:
        return Step("warn", kind, max(due, now + lead), since)
    return WAIT


def projected(rule: Rule, facts: Facts, pending: Pending) -> tuple[str, float] | None:
    """(kind, when it would act) if nothing changes from now; None while nothing is due (in
    use, or no rule). What the instance page and the API show."""
    if pending.warned_at is not None and pending.acts_at is not None:
        return pending.kind, pending.acts_at
    deadlines = sorted(_deadlines(rule, facts))
    if not deadlines:
        return None
    due, kind, since = deadlines[0]
    if pending.acted_at is not None and since <= pending.acted_at:
        return None
    lead = 0.0 if rule.action == "notify" and kind == IDLE else float(rule.warning_minutes) * 60
    return kind, max(due, facts.now + lead)
