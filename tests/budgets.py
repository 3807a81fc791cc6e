"""The suite's time budgets (README: Tests and checks), checked by the suite itself.

Every run ends with its wall time and its 30 slowest tests. A test over its tier's budget fails
the run, named, so that a slow test added later shows up as that test, not as a suite that
creeps past CI's limit:

- a test of the fast tier (no process marker, not `slow`): its call, FAST_CALL_S;
- a `slow` test (property-based, fuzz, migrations): setup, call and teardown, SLOW_S;
- a test that starts processes: setup, call and teardown, PROCESS_S (a module's first test
  pays for what the module starts once: that is the module's cost, and it counts too).

The budgets are for CI's busy 2-core machine; TEST_BUDGET_SCALE multiplies them on a slower
one (or a run under a debugger: 0 turns the check off). Under pytest-xdist the controller
sees every worker's reports and checks them all.
"""

import os
import time
from collections import defaultdict

import pytest

FAST_CALL_S = 5.0
SLOW_S = 120.0
PROCESS_S = 300.0
PROCESS_MARKERS = ("integration", "containers", "browser")
SHOWN = 30


def budget(keywords) -> tuple[str, float]:
    """(tier, seconds) for a test with these keywords (its markers among them)."""
    if any(name in keywords for name in PROCESS_MARKERS):
        return "process", PROCESS_S
    if "slow" in keywords:
        return "slow", SLOW_S
    return "fast", FAST_CALL_S


class Budgets:
    def __init__(self, scale: float):
        self.scale = scale
        self.started = time.monotonic()
        self.seconds: dict[str, float] = defaultdict(float)  # setup + call + teardown
        self.call: dict[str, float] = {}
        self.tier: dict[str, tuple[str, float]] = {}

    def pytest_runtest_logreport(self, report):
        self.seconds[report.nodeid] += report.duration
        if report.when == "call":
            self.call[report.nodeid] = report.duration
        self.tier.setdefault(report.nodeid, budget(report.keywords))

    def over(self) -> list[tuple[str, str, float, float]]:
        found = []
        for nodeid, (tier, allowed) in self.tier.items():
            taken = self.call.get(nodeid, 0.0) if tier == "fast" else self.seconds[nodeid]
            if taken > allowed * self.scale:
                found.append((nodeid, tier, taken, allowed * self.scale))
        return sorted(found, key=lambda row: -row[2])

    def pytest_terminal_summary(self, terminalreporter):
        wall = time.monotonic() - self.started
        write = terminalreporter.write_line
        terminalreporter.section("time")
        write(f"{len(self.seconds)} tests in {wall:.0f} s of wall time")
        slowest = sorted(self.seconds.items(), key=lambda item: -item[1])[:SHOWN]
        write(f"the {len(slowest)} slowest (setup + call + teardown):")
        for nodeid, seconds in slowest:
            write(f"{seconds:8.2f} s  {nodeid}")
        if not self.scale:
            return
        over = self.over()
        if over:
            terminalreporter.section("over budget", red=True)
            for nodeid, tier, taken, allowed in over:
                write(f"{nodeid}: {taken:.2f} s, a {tier} test's budget is {allowed:.2f} s")
            write("(tests/budgets.py: make it cheaper, or move it to the tier it belongs to)")
            self.session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_sessionstart(self, session):
        self.session = session


def pytest_configure(config):
    if hasattr(config, "workerinput"):
        return  # an xdist worker: the controller checks
    scale = float(os.environ.get("TEST_BUDGET_SCALE", "1"))
    config.pluginmanager.register(Budgets(scale), "gpucloud-budgets")
