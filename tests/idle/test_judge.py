"""The idle watch's decisions, from plain figures (times in seconds)."""

from decimal import Decimal

from console.idle.judge import Facts, Pending, decide, idle_since, projected
from tests.idle.test_rules import rule

QUIET = {"ssh": (0, None), "terminal": (0, None), "ports": (0, None)}
WINDOW = rule(window_minutes=Decimal(1), warning_minutes=Decimal("0.5"))  # 60 s, then 30 s


def facts(now, **changes) -> Facts:
    base = {"running_since": 0.0, "latest_sample": now - 1, "sessions": QUIET}
    return Facts(now=now, **{**base, **changes})


def test_idle_since_is_the_last_use_of_any_counted_signal():
    sessions = {**QUIET, "ports": (0, 40.0)}
    assert idle_since(WINDOW, facts(100, last_busy=20.0, sessions=sessions)) == 40.0
    assert idle_since(WINDOW, facts(100, last_busy=50.0, sessions=sessions)) == 50.0
    # a signal turned off does not count
    ports_off = rule(count_ports=False)
    assert idle_since(ports_off, facts(100, last_busy=20.0, sessions=sessions)) == 20.0


def test_an_open_session_or_no_recent_sample_is_never_idle():
    assert idle_since(WINDOW, facts(100, sessions={**QUIET, "ssh": (1, 10.0)})) is None
    ssh_open = {**QUIET, "ssh": (1, 10.0)}
    assert idle_since(rule(count_ssh=False), facts(100, sessions=ssh_open)) == 0.0
    assert idle_since(WINDOW, facts(100, latest_sample=None)) is None
    assert idle_since(WINDOW, facts(100, latest_sample=60.0)) is None  # 40 s old
    # without the GPU signal, samples do not matter
    assert idle_since(rule(count_gpu=False), facts(100, latest_sample=None)) == 0.0


def test_warned_after_the_window_then_acted_on_at_the_time_said():
    assert decide(WINDOW, facts(50), Pending()).what == "wait"
    warn = decide(WINDOW, facts(61), Pending())
    assert (warn.what, warn.kind, warn.acts_at) == ("warn", "idle", 91.0)
    pending = Pending(kind="idle", warned_at=61.0, acts_at=91.0)
    assert decide(WINDOW, facts(80), pending).what == "wait"
    act = decide(WINDOW, facts(91), pending)
    assert (act.what, act.since) == ("act", 0.0)
    # acted: nothing more in this stretch
    assert decide(WINDOW, facts(200), Pending(acted_at=91.0)).what == "wait"


def test_a_late_round_still_gives_the_whole_warning():
    assert decide(WINDOW, facts(500), Pending()).acts_at == 530.0


def test_use_after_the_warning_clears_it():
    pending = Pending(kind="idle", warned_at=61.0, acts_at=91.0)
    assert decide(WINDOW, facts(70, last_busy=65.0), pending).what == "clear"
    in_use = facts(70, sessions={**QUIET, "terminal": (1, 66.0)})
    assert decide(WINDOW, in_use, pending).what == "clear"
    kept = facts(70, kept_at=68.0, kept_kind="idle")
    assert decide(WINDOW, kept, pending).what == "clear"
    # kept: the window starts again from then
    assert decide(WINDOW, facts(129, kept_at=68.0, kept_kind="idle"), Pending()).what == "warn"
    assert decide(WINDOW, facts(127, kept_at=68.0, kept_kind="idle"), Pending()).what == "wait"


def test_a_busy_gpu_is_never_warned():
    for now in (100.0, 1000.0):
        assert decide(WINDOW, facts(now, last_busy=now - 1), Pending()).what == "wait"


def test_notify_tells_once_per_idle_stretch_without_a_warning():
    notify = rule(window_minutes=Decimal(1), action="notify")
    assert decide(notify, facts(59), Pending()).what == "wait"
    assert decide(notify, facts(60), Pending()).what == "act"
    assert decide(notify, facts(300), Pending(acted_at=60.0)).what == "wait"
    # used again after it told, then idle for another window: told again
    assert decide(notify, facts(400, last_busy=320.0), Pending(acted_at=60.0)).what == "act"


def test_the_maximum_runtime_is_warned_of_ahead_and_acted_on_at_its_end():
    limit = rule(window_minutes=None, max_runtime_minutes=Decimal(10), warning_minutes=Decimal(2))
    busy = {"last_busy": None, "sessions": {**QUIET, "ssh": (1, None)}}
    assert decide(limit, facts(400, **busy), Pending()).what == "wait"
    warn = decide(limit, facts(480, **busy), Pending())
    assert (warn.what, warn.kind, warn.acts_at) == ("warn", "max_runtime", 600.0)
    pending = Pending(kind="max_runtime", warned_at=480.0, acts_at=600.0)
    assert decide(limit, facts(600, **busy), pending).what == "act"
    # kept running: another maximum runtime from then
    kept = facts(700, kept_at=500.0, kept_kind="max_runtime", **busy)
    assert decide(limit, kept, Pending()).what == "wait"


def test_projected_says_when_it_would_act():
    assert projected(WINDOW, facts(30), Pending()) == ("idle", 90.0)
    assert projected(WINDOW, facts(30, sessions={**QUIET, "ssh": (1, 1.0)}), Pending()) is None
    assert projected(WINDOW, facts(70), Pending(kind="idle", warned_at=61.0, acts_at=91.0)) == (
        "idle",
        91.0,
    )
