"""The policy in force on an instance: the strictest of its levels (the operator's for its
tenant, the tenant's default, the instance's own), field by field.

"Stricter" per field, so that no level can loosen another:

| field | stricter is | levels that leave it empty |
| --- | --- | --- |
| window_minutes | shorter | say nothing (no idle rule there) |
| threshold_percent | higher (more counts as idle) | - |
| count_gpu, count_ssh, count_terminal, count_ports | off (fewer things keep it busy) | - |
| action | harsher: notify < stop < shelve < terminate | - |
| warning_minutes | shorter | - |
| allow_keep_running | no | - |
| max_runtime_minutes | shorter | say nothing (no limit there) |

Every level that exists takes part in every field; with no level, nothing is in force."""

from collections.abc import Iterable
from dataclasses import dataclass, fields
from decimal import Decimal

from console.idle.models import Action

SEVERITY = {Action.NOTIFY: 0, Action.STOP: 1, Action.SHELVE: 2, Action.TERMINATE: 3}
SIGNALS = ("gpu", "ssh", "terminal", "ports")


@dataclass(frozen=True)
class Rule:
    window_minutes: Decimal | None
    threshold_percent: int
    count_gpu: bool
    count_ssh: bool
    count_terminal: bool
    count_ports: bool
    action: str
    warning_minutes: Decimal
    allow_keep_running: bool
    max_runtime_minutes: Decimal | None

    @classmethod
    def of(cls, policy) -> "Rule":
        """The rule a policy row (any level) says."""
        return cls(**{f.name: getattr(policy, f.name) for f in fields(cls)})

    def counts(self, signal: str) -> bool:
        return getattr(self, f"count_{signal}")

    @property
    def watches(self) -> bool:
        """Whether it can ever act: an idle rule or a maximum runtime."""
        return self.window_minutes is not None or self.max_runtime_minutes is not None


def _least(values: Iterable[Decimal | None]) -> Decimal | None:
    present = [value for value in values if value is not None]
    return min(present) if present else None


def strictest(rules: list[Rule]) -> Rule | None:
    """The rule in force where these levels apply (None: no level)."""
    if not rules:
        return None
    return Rule(
        window_minutes=_least(r.window_minutes for r in rules),
        threshold_percent=max(r.threshold_percent for r in rules),
        count_gpu=all(r.count_gpu for r in rules),
        count_ssh=all(r.count_ssh for r in rules),
        count_terminal=all(r.count_terminal for r in rules),
        count_ports=all(r.count_ports for r in rules),
        action=max((r.action for r in rules), key=lambda action: SEVERITY[action]),
        warning_minutes=min(r.warning_minutes for r in rules),
        allow_keep_running=all(r.allow_keep_running for r in rules),
        max_runtime_minutes=_least(r.max_runtime_minutes for r in rules),
    )


def at_least_as_strict(rule: Rule, other: Rule) -> bool:
    """Whether `rule` is, field by field, at least as strict as `other`."""
    return strictest([rule, other]) == rule


def weaker_fields(values: dict, floor: Rule) -> dict[str, str]:
    """The fields of `values` (a level's submitted policy) that would be weaker than the
    operator's `floor`, each with a sentence saying what the operator allows at most."""
    errors = {}

    def shorter(name: str, what: str) -> None:
        mine, theirs = values.get(name), getattr(floor, name)
        if mine is not None and theirs is not None and mine > theirs:
            errors[name] = f"Your operator's policy sets {what} of at most {theirs} minutes."

    shorter("window_minutes", "an idle window")
    shorter("max_runtime_minutes", "a maximum runtime")
    shorter("warning_minutes", "a warning")
    if values.get("threshold_percent", floor.threshold_percent) < floor.threshold_percent:
        errors["threshold_percent"] = (
            f"Your operator's policy counts a GPU under {floor.threshold_percent} % as idle: "
            "the threshold cannot be lower."
        )
    for signal in SIGNALS:
        name = f"count_{signal}"
        if values.get(name) and not getattr(floor, name):
            errors[name] = f"Your operator's policy does not count {signal} as use."
    action = values.get("action")
    if action and SEVERITY[action] < SEVERITY[floor.action]:
        errors["action"] = f"Your operator's policy acts with {floor.action}; it cannot be milder."
    if values.get("allow_keep_running") and not floor.allow_keep_running:
        errors["allow_keep_running"] = "Your operator's policy does not allow keeping it running."
    return errors
