"""Idle policies: setting them (each level), the policy in force on an instance, and the idle
watch's round (run by console.idle.tasks.evaluate every IDLE_CHECK_SECONDS): warn, act, record
what it did and why, with the figures."""

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from accounts.models import Tenant
from console import activity
from console.errors import DomainError, ErrorCode
from console.idle import judge
from console.idle import locks as idle_locks
from console.idle.models import Action, InstancePolicy, OperatorPolicy, TenantPolicy, Watch
from console.idle.rules import SIGNALS, Rule, strictest, weaker_fields
from console.instances import lifecycle, locks, reasons, runs
from console.instances import services as instance_services
from console.instances.models import Instance, State
from console.metrics import live
from console.metrics.ingest import instance_series
from console.metrics.models import MetricMinute
from console.notices import notice
from console.snapshots import services as snapshot_services

log = logging.getLogger(__name__)

# What the watch looks back at beyond the window and its warning (samples arrive late).
LOOKBACK_MARGIN_SECONDS = 60.0


class KeepRunningRefused(DomainError):
    code = ErrorCode.KEEP_RUNNING_REFUSED
    status = 409


# --- the levels ---------------------------------------------------------------------------


def levels(instance: Instance) -> dict[str, Rule | None]:
    """Each level's rule on this instance (None where it sets none)."""
    found = {
        "operator": OperatorPolicy.objects.filter(tenant_id=instance.tenant_id).first(),
        "tenant": TenantPolicy.objects.filter(tenant_id=instance.tenant_id).first(),
        "instance": InstancePolicy.objects.filter(instance_id=instance.pk).first(),
    }
    return {level: Rule.of(policy) if policy else None for level, policy in found.items()}


def in_force(instance: Instance) -> Rule | None:
    """The strictest of the instance's levels (None: no policy applies)."""
    return strictest([rule for rule in levels(instance).values() if rule is not None])


def _check_floor(tenant: Tenant, values: dict) -> None:
    """Refuse, field by field, what would be weaker than the operator's policy."""
    floor = OperatorPolicy.objects.filter(tenant=tenant).first()
    if floor is None:
        return
    errors = weaker_fields(values, Rule.of(floor))
    if errors:
        raise ValidationError(errors)


def _save(model, lookup: dict, values: dict):
    policy = model.objects.filter(**lookup).first() or model(**lookup)
    for name, value in values.items():
        setattr(policy, name, value)
    policy.updated_at = timezone.now()
    policy.full_clean()
    policy.save()
    return policy


def set_tenant_policy(tenant: Tenant, values: dict, *, actor=None) -> TenantPolicy:
    """The tenant's default: `values` are the fields given (others keep theirs, or the
    defaults); a field weaker than the operator's policy is refused with a field error."""
    _check_floor(tenant, values)
    with transaction.atomic():
        return _save(TenantPolicy, {"tenant": tenant}, values)


def clear_tenant_policy(tenant: Tenant, *, actor=None) -> None:
    TenantPolicy.objects.filter(tenant=tenant).delete()


def set_instance_policy(instance: Instance, values: dict, *, actor=None) -> InstancePolicy:
    """The instance's own policy, as set_tenant_policy; its page's event says so."""
    _check_floor(instance.tenant, values)
    with transaction.atomic():
        policy = _save(InstancePolicy, {"instance": instance}, values)
        lifecycle.announce_note(
            instance, "Idle policy set: " + describe(Rule.of(policy)), actor=actor
        )
    return policy


def clear_instance_policy(instance: Instance, *, actor=None) -> None:
    with transaction.atomic():
        if InstancePolicy.objects.filter(instance=instance).delete()[0]:
            lifecycle.announce_note(instance, "Idle policy of its own removed", actor=actor)


def describe(rule: Rule) -> str:
    """The rule in words: "stop when under 5 % GPU, no SSH, terminal or port use for 30 min
    (warning 10 min ahead); at most 480 min a run"."""
    parts = []
    if rule.window_minutes is not None:
        used = [s for s in SIGNALS if rule.counts(s) and s != "gpu"]
        what = [f"under {rule.threshold_percent} % GPU"] if rule.count_gpu else []
        if used:
            what.append("no " + ", ".join(used) + " use")
        parts.append(
            f"{rule.action} when {' and '.join(what) or 'unused'} for "
            f"{_minutes(rule.window_minutes)}"
            + (
                ""
                if rule.action == Action.NOTIFY
                else f" (warning {_minutes(rule.warning_minutes)} ahead)"
            )
        )
    if rule.max_runtime_minutes is not None:
        parts.append(f"{rule.action} after {_minutes(rule.max_runtime_minutes)} a run")
    if not rule.allow_keep_running:
        parts.append("no keeping it running")
    return "; ".join(parts) or "nothing (no window, no maximum runtime)"


def describe_policy(policy) -> str:
    """A policy row (any level) in words."""
    return describe(Rule.of(policy))


def _minutes(value: Decimal) -> str:
    return f"{value.normalize():f} min"


# --- keep it running ----------------------------------------------------------------------


def keep_running(instance: Instance, *, actor=None) -> Watch:
    """The tenant's answer to a warning: the idle action (or the maximum runtime) is off, once
    per run: the idle window starts again now (the maximum runtime: another one from now).
    Refused (409) when nothing was warned of, when the policy in force forbids it, or when it
    was kept running once already in this run."""
    rule = in_force(instance)
    with transaction.atomic():
        locked = locks.instance(instance.pk)
        if locked is None or locked.state != State.RUNNING:
            raise KeepRunningRefused("It is not running.")
        watch = _watch(locked)
        if watch.warned_at is None:
            raise KeepRunningRefused("Nothing is about to happen to it: there is no warning.")
        if rule is None or not rule.allow_keep_running:
            raise KeepRunningRefused(
                "The idle policy in force (your operator's) does not allow keeping it running.",
                code=ErrorCode.KEEP_RUNNING_FORBIDDEN,
            )
        if watch.kept_at is not None:
            raise KeepRunningRefused(
                "It was kept running once in this run already: it can be kept running once.",
                code=ErrorCode.KEPT_RUNNING_ALREADY,
            )
        kind = watch.kind
        now = timezone.now()
        Watch.objects.filter(pk=watch.pk).update(
            kept_at=now, kept_kind=kind, kind="", warned_at=None, acts_at=None
        )
        what = (
            "its idle window starts again"
            if kind == Watch.Kind.IDLE
            else ("its maximum runtime starts again")
        )
        lifecycle.announce_note(locked, f"Kept running: {what} (once per run)", actor=actor)
        watch.refresh_from_db()
    return watch


def _watch(instance: Instance) -> Watch:
    """The instance's watch, locked, for its current run (a new run starts a clean one)."""
    watch = idle_locks.watch(instance)
    current = instance.current_allocation()
    allocation_id = current.pk if current else ""
    if watch.allocation_id != allocation_id:
        Watch.objects.filter(pk=watch.pk).update(
            allocation_id=allocation_id, kind="", warned_at=None, acts_at=None, acted_at=None,
            kept_at=None, kept_kind="", shelve_on_stop=False,
        )  # fmt: skip
        watch.refresh_from_db()
    return watch


# --- the watch's figures -----------------------------------------------------------------


def _epoch(moment: datetime | None) -> float | None:
    return moment.timestamp() if moment is not None else None


def _moment(epoch: float | None) -> datetime | None:
    return datetime.fromtimestamp(epoch, UTC) if epoch is not None else None


@dataclass(frozen=True)
class Gpu:
    last_busy: float | None
    latest: float | None
    peak: float | None


def gpu_figures(instance_pk: int, rule: Rule, since: float, now: float) -> Gpu:
    """Its slice's utilisation from `since`: the live window at full rate, the history's
    minutes before it."""
    threshold = rule.threshold_percent
    window = float(rule.window_minutes or 0) * 60
    live_from = now - live.window_seconds()
    series = instance_series(instance_pk)
    rows = live.store().window(series, since=max(since, live_from))
    readings = [(row[0], row[1]) for row in rows if row[1] is not None]
    busy = [ts for ts, util in readings if util >= threshold]
    last_busy = busy[-1] if busy else None
    if last_busy is None and since < live_from:
        minute = (
            MetricMinute.objects.filter(
                series=series,
                minute__gte=_moment(since - 60),
                minute__lt=_moment(live_from),
                gpu_util_max__gte=threshold,
            )
            .order_by("-minute")
            .values_list("minute", flat=True)
            .first()
        )
        last_busy = minute.timestamp() + 60 if minute else None
    peak = max((util for ts, util in readings if ts >= now - window), default=None)
    return Gpu(last_busy, rows[-1][0] if rows else None, peak)


def facts_of(instance: Instance, rule: Rule, watch: Watch, now: float) -> judge.Facts | None:
    """What the judge needs of a running instance (None: its run's start is unknown)."""
    started = _epoch(runs.run_started(instance))
    if started is None:
        return None
    lookback = float((rule.window_minutes or 0) + rule.warning_minutes) * 60
    since = max(started, now - lookback - LOOKBACK_MARGIN_SECONDS)
    gpu = gpu_figures(instance.pk, rule, since, now) if rule.count_gpu else Gpu(None, None, None)
    return judge.Facts(
        now=now,
        running_since=started,
        last_busy=gpu.last_busy,
        latest_sample=gpu.latest,
        peak_util=gpu.peak,
        sessions=activity.seen(instance.pk),
        kept_at=_epoch(watch.kept_at),
        kept_kind=watch.kept_kind,
    )


def _pending(watch: Watch) -> judge.Pending:
    return judge.Pending(
        kind=watch.kind,
        warned_at=_epoch(watch.warned_at),
        acts_at=_epoch(watch.acts_at),
        acted_at=_epoch(watch.acted_at),
    )


def _clock(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%H:%M:%S UTC")


def figures(rule: Rule, facts: judge.Facts, step: judge.Step) -> dict:
    """The numbers an event and a notice carry."""
    return {
        "kind": step.kind,
        "action": rule.action,
        "window_minutes": str(rule.window_minutes) if rule.window_minutes is not None else None,
        "threshold_percent": rule.threshold_percent,
        "peak_gpu_util": facts.peak_util,
        "idle_since": _moment(step.since).isoformat() if step.since else None,
        "last_activity": {
            signal: _moment(last).isoformat() if last else None
            for signal, (_, last) in facts.sessions.items()
        },
        "max_runtime_minutes": (
            str(rule.max_runtime_minutes) if rule.max_runtime_minutes is not None else None
        ),
        "acts_at": _moment(step.acts_at).isoformat() if step.acts_at else None,
    }


def why(rule: Rule, facts: judge.Facts, step: judge.Step) -> str:
    """Why, in words, with the figures."""
    if step.kind == judge.MAX_RUNTIME:
        return (
            f"it reached its maximum runtime of {_minutes(rule.max_runtime_minutes)} "
            f"(running since {_clock(step.since)})"
        )
    used = [s for s in SIGNALS if rule.counts(s) and s != "gpu"]
    said = [f"idle since {_clock(step.since)}, for its {_minutes(rule.window_minutes)} window"]
    if rule.count_gpu:
        peak = "no reading" if facts.peak_util is None else f"{facts.peak_util:g} %"
        said.append(f"GPU at most {peak} (under {rule.threshold_percent} %)")
    if used:
        said.append("no " + ", ".join(used) + " use")
    return ": ".join([said[0], ", ".join(said[1:])]) if len(said) > 1 else said[0]


# --- the round ----------------------------------------------------------------------------


def watched() -> list[int]:
    """Running instances some policy applies to, in pk order."""
    return list(
        Instance.objects.filter(state=State.RUNNING)
        .filter(
            Q(idle_policy__isnull=False)
            | Q(tenant__idle_policy__isnull=False)
            | Q(tenant__operator_idle_policy__isnull=False)
        )
        .order_by("pk")
        .values_list("pk", flat=True)
        .distinct()
    )


def evaluate_all(now: float | None = None) -> dict[str, int]:
    """One round of the watch over every watched instance, and the shelving of those it
    stopped to shelve; answers how many of each step."""
    counts: dict[str, int] = {"shelve": shelve_stopped()}
    for pk in watched():
        try:
            step = evaluate(pk, now)
        except Exception:
            log.exception("idle watch of instance %s failed", pk)
            step = "failed"
        counts[step] = counts.get(step, 0) + 1
    return counts


def shelve_stopped() -> int:
    """Shelve the instances the watch stopped to shelve, once they are stopped (one started
    again meanwhile is left as it is). Answers how many it shelved."""
    shelved = 0
    for watch in Watch.objects.filter(shelve_on_stop=True).select_related("instance"):
        if watch.instance.state == State.STOPPING:
            continue
        with transaction.atomic():
            if not Watch.objects.filter(pk=watch.pk, shelve_on_stop=True).update(
                shelve_on_stop=False
            ):
                continue  # another round took it
            if watch.instance.state != State.STOPPED:
                continue
            try:
                snapshot_services.shelve_instance(watch.instance)
            except DomainError as error:
                log.info("idle shelve of instance %s skipped: %s", watch.instance_id, error)
                continue
        shelved += 1
    return shelved


def evaluate(instance_pk: int, now: float | None = None) -> str:
    """The watch's step for one instance, taken under its lock: idempotent (a second round at
    the same moment finds the warning sent, or the action taken)."""
    now = now if now is not None else timezone.now().timestamp()
    instance = Instance.objects.select_related("tenant").filter(pk=instance_pk).first()
    if instance is None or instance.state != State.RUNNING:
        return "wait"
    rule = in_force(instance)
    if rule is None or not rule.watches:
        return "wait"
    with transaction.atomic():
        locked = locks.instance(instance_pk, "tenant")
        if locked is None or locked.state != State.RUNNING:
            return "wait"
        watch = _watch(locked)
        facts = facts_of(locked, rule, watch, now)
        if facts is None:
            return "wait"
        step = judge.decide(rule, facts, _pending(watch))
        if step.what == "warn":
            _warn(locked, watch, rule, facts, step)
        elif step.what == "clear":
            _clear(locked, watch)
        elif step.what == "act":
            _act(locked, watch, rule, facts, step)
    return step.what


def _announce(instance: Instance, kind: str, text: str, data: dict) -> None:
    transaction.on_commit(
        lambda: notice.send(
            sender=__name__,
            tenant=instance.tenant,
            kind=kind,
            subject=instance,
            text=text,
            data={"instance": instance.pk, **data},
        )  # fmt: skip
    )


def _warn(instance, watch, rule: Rule, facts: judge.Facts, step: judge.Step) -> None:
    Watch.objects.filter(pk=watch.pk).update(
        kind=step.kind, warned_at=_moment(facts.now), acts_at=_moment(step.acts_at)
    )
    keep = (
        " unless it is used or kept running" if rule.allow_keep_running else (" unless it is used")
    )
    if step.kind == judge.MAX_RUNTIME:
        keep = " unless kept running" if rule.allow_keep_running else ""
    text = f"{rule.action.capitalize()} at {_clock(step.acts_at)}{keep}: {why(rule, facts, step)}"
    lifecycle.announce_note(instance, f"Idle policy warning: {text}")
    _announce(
        instance, "instance.idle_warning", f"{instance.name}: {text}", figures(rule, facts, step)
    )


def _clear(instance, watch) -> None:
    kept = watch.kept_at is not None and watch.warned_at and watch.kept_at >= watch.warned_at
    Watch.objects.filter(pk=watch.pk).update(kind="", warned_at=None, acts_at=None)
    if watch.warned_at and not kept:
        lifecycle.announce_note(instance, "Idle policy: in use again; nothing will be done")


def _act(instance, watch, rule: Rule, facts: judge.Facts, step: judge.Step) -> None:
    Watch.objects.filter(pk=watch.pk).update(
        acted_at=_moment(facts.now), kind="", warned_at=None, acts_at=None
    )
    said = why(rule, facts, step)
    data = figures(rule, facts, step)
    if rule.action == Action.NOTIFY:
        lifecycle.announce_note(instance, f"Idle policy (notify only): {said}")
        _announce(instance, "instance.idle_warning", f"{instance.name}: {said}", data)
        return
    code = (
        reasons.Code.RUNTIME_LIMIT if step.kind == judge.MAX_RUNTIME else reasons.Code.IDLE_STOPPED
    )
    try:
        if rule.action in (Action.STOP, Action.SHELVE):
            instance_services.stop_instance(instance, actor=None, reason=reasons.Reason(code, said))
            if rule.action == Action.SHELVE:
                Watch.objects.filter(pk=watch.pk).update(shelve_on_stop=True)
        else:
            lifecycle.announce_note(instance, f"Idle policy: terminating: {said}")
            instance_services.terminate_instance(instance, actor=None)
    except DomainError as error:
        log.info("idle policy of instance %s: %s skipped: %s", instance.pk, rule.action, error)
        return
    done = {Action.STOP: "stopped", Action.SHELVE: "stopped to be shelved"}.get(
        rule.action, "terminated"
    )
    _announce(instance, "instance.idle_stopped", f"{instance.name} {done}: {said}", data)


def status(instance: Instance, now: float | None = None) -> dict:
    """The policy in force and when it acts, as the instance page and the API show them."""
    now = now if now is not None else timezone.now().timestamp()
    rule = in_force(instance)
    shown = {"in_force": None, "summary": "", "acts_at": None, "acts_in_seconds": None,
             "kind": "", "warned": False, "can_keep_running": False}  # fmt: skip
    if rule is None:
        return shown
    shown.update(in_force=rule, summary=describe(rule))
    if instance.state != State.RUNNING:
        return shown
    watch = Watch.objects.filter(instance=instance).first() or Watch(instance=instance)
    current = instance.current_allocation()
    if current is None or watch.allocation_id != current.pk:
        watch = Watch(instance=instance)
    facts = facts_of(instance, rule, watch, now)
    if facts is None:
        return shown
    ahead = judge.projected(rule, facts, _pending(watch))
    if ahead is not None:
        kind, when = ahead
        shown.update(kind=kind, acts_at=_moment(when), acts_in_seconds=max(0, round(when - now)))
    shown["warned"] = watch.warned_at is not None
    shown["can_keep_running"] = (
        shown["warned"] and rule.allow_keep_running and watch.kept_at is None
    )
    return shown
