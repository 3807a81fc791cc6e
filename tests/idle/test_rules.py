"""The policy in force is the strictest of its levels, field by field, and a tenant cannot
submit a field weaker than its operator's."""

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from console.idle.rules import Rule, at_least_as_strict, strictest, weaker_fields

minutes = st.decimals(min_value=Decimal("0.05"), max_value=Decimal(10080), places=2)
rules = st.builds(
    Rule,
    window_minutes=st.none() | minutes,
    threshold_percent=st.integers(1, 100),
    count_gpu=st.booleans(),
    count_ssh=st.booleans(),
    count_terminal=st.booleans(),
    count_ports=st.booleans(),
    action=st.sampled_from(["notify", "stop", "terminate"]),
    warning_minutes=st.decimals(min_value=Decimal(0), max_value=Decimal(1440), places=2),
    allow_keep_running=st.booleans(),
    max_runtime_minutes=st.none() | minutes,
)


def rule(**changes) -> Rule:
    base = {
        "window_minutes": Decimal(30), "threshold_percent": 5, "count_gpu": True,
        "count_ssh": True, "count_terminal": True, "count_ports": True, "action": "stop",
        "warning_minutes": Decimal(10), "allow_keep_running": True, "max_runtime_minutes": None,
    }  # fmt: skip
    return Rule(**{**base, **changes})


@pytest.mark.slow
@given(st.lists(rules, min_size=1, max_size=4))
def test_the_rule_in_force_is_at_least_as_strict_as_every_level(levels):
    in_force = strictest(levels)
    for level in levels:
        assert at_least_as_strict(in_force, level)
    # and no stricter than it has to be: each field is one of the levels'
    for name in ("threshold_percent", "action", "warning_minutes"):
        assert getattr(in_force, name) in {getattr(level, name) for level in levels}


@pytest.mark.slow
@given(st.lists(rules, min_size=1, max_size=4), st.randoms())
def test_the_order_of_the_levels_does_not_matter(levels, random):
    shuffled = list(levels)
    random.shuffle(shuffled)
    assert strictest(shuffled) == strictest(levels)


@pytest.mark.slow
@given(rules, rules)
def test_a_level_that_passes_the_operators_check_is_as_strict_as_the_operators(mine, floor):
    values = {name: getattr(mine, name) for name in Rule.__dataclass_fields__}
    sets_what_the_operator_sets = all(
        getattr(mine, name) is not None or getattr(floor, name) is None
        for name in ("window_minutes", "max_runtime_minutes")
    )
    if not weaker_fields(values, floor) and sets_what_the_operator_sets:
        assert at_least_as_strict(mine, floor)
    assert at_least_as_strict(strictest([mine, floor]), floor)


def test_each_field_takes_its_stricter_value():
    operator = rule(
        window_minutes=Decimal(60), threshold_percent=10, count_ssh=False, action="stop",
        warning_minutes=Decimal(5), allow_keep_running=False,
    )  # fmt: skip
    tenant = rule(window_minutes=Decimal(30), threshold_percent=3, action="terminate",
                  warning_minutes=Decimal(15), max_runtime_minutes=Decimal(480))  # fmt: skip
    assert strictest([operator, tenant]) == rule(
        window_minutes=Decimal(30), threshold_percent=10, count_ssh=False, action="terminate",
        warning_minutes=Decimal(5), allow_keep_running=False, max_runtime_minutes=Decimal(480),
    )  # fmt: skip


def test_a_level_without_a_window_or_limit_says_nothing_of_them():
    assert strictest([rule(window_minutes=None), rule(window_minutes=Decimal(20))]).window_minutes
    assert strictest([rule(window_minutes=None)]).window_minutes is None
    assert strictest([]) is None


def test_weaker_fields_each_say_what_the_operator_allows():
    floor = rule(
        window_minutes=Decimal(30), threshold_percent=10, count_ssh=False, action="stop",
        allow_keep_running=False, max_runtime_minutes=Decimal(60),
    )  # fmt: skip
    errors = weaker_fields(
        {"window_minutes": Decimal(120), "threshold_percent": 5, "count_ssh": True,
         "action": "notify", "allow_keep_running": True, "max_runtime_minutes": Decimal(90),
         "warning_minutes": Decimal(10)},
    floor)  # fmt: skip
    assert set(errors) == {
        "window_minutes", "threshold_percent", "count_ssh", "action", "allow_keep_running",
        "max_runtime_minutes",
    }  # fmt: skip
    assert "at most 30 minutes" in errors["window_minutes"]
    # as strict or stricter is fine, and what is left out is not checked
    assert not weaker_fields({"window_minutes": Decimal(10), "action": "terminate"}, floor)
