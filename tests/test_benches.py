"""What bench/metrics.py and bench/api.py print as their targets: the per-core scaling table,
each figure against the baseline of the same run, and the verdicts."""

import argparse
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # as when the bench runs as a script
    return lambda name: runpy.run_path(str(BENCH / f"{name}.py"))


def result(push, gpus, *, per_s, cpu, p99, lost=0, watch="ws"):
    return {"push": push, "watch": watch, "gpus": gpus, "viewers": 500, "samples_per_s": per_s,
            "server_cpu": cpu, "p99_ms": p99, "lost": lost}  # fmt: skip


def test_scaling_runs_an_agents_and_a_bare_run_at_each_size(bench):
    planned_runs = bench("metrics")["planned_runs"]
    args = argparse.Namespace(scale=[1000, 10000], gpus=8)
    runs = planned_runs(["scaling"], args)
    assert [(name, spec["agents"], spec["viewers"], spec["push"]) for name, spec in runs] == [
        ("agent-1000", 125, 500, "agent"),
        ("bare-1000", 125, 500, "bare"),
        ("agent-10000", 1250, 500, "agent"),
        ("bare-10000", 1250, 500, "bare"),
    ]
    # a fleet smaller than 500 GPUs is watched whole
    assert planned_runs(["scaling"], argparse.Namespace(scale=[80], gpus=8))[0][1]["viewers"] == 80
    with pytest.raises(ValueError, match="unknown run 'huge'"):
        planned_runs(["huge"], args)


def test_scale_sizes_must_be_numbers_of_gpus(bench):
    sizes = bench("metrics")["sizes"]
    assert sizes("1000, 5000,10000") == [1000, 5000, 10000]
    for bad in ("1000,lots", "", "0"):
        with pytest.raises(argparse.ArgumentTypeError, match="numbers of GPUs"):
            sizes(bad)


def test_the_scaling_table_gives_samples_per_web_core_and_ratios_to_the_bare_path(bench):
    scaling_table = bench("metrics")["scaling_table"]
    text = scaling_table([
        result("agent", 1000, per_s=2000, cpu=0.5, p99=20.0),
        result("bare", 1000, per_s=1000, cpu=0.1, p99=8.0),
        result("agent", 5000, per_s=10000, cpu=1.6, p99=300.0, lost=12),
        result("agent", 1000, per_s=2000, cpu=0.5, p99=9000.0, watch="poll"),
    ])  # fmt: skip
    rows = [line for line in text.splitlines() if line.startswith("| ") and "GPUs" not in line]
    assert rows == [
        "| 1000 | 2000 | 0.50 | 4000 | 0 | 20.0 | 1000, 0.10, 8.0 | 5.0× | 2.5× |",
        "| 5000 | 10000 | 1.60 | 6250 | 12 | 300.0 | not run | – | – |",
    ]


def test_the_scaling_verdict_needs_ten_thousand_gpus_fast_and_nothing_lost(bench):
    verdict = bench("metrics")["scaling_verdict"]
    small = result("agent", 5000, per_s=10000, cpu=1.0, p99=30.0)
    assert verdict([small]).endswith("not measured in this run (largest fleet: 5,000 GPUs)")
    fast = result("agent", 10000, per_s=20000, cpu=1.8, p99=180.0)
    assert verdict([small, fast]).endswith(": met (p99 180.0 ms)")
    slow = result("agent", 10000, per_s=20000, cpu=1.9, p99=400.0)
    assert verdict([slow]).endswith(": MISSED (p99 400.0 ms)")
    lossy = result("agent", 10000, per_s=20000, cpu=1.8, p99=180.0, lost=3)
    assert "MISSED" in verdict([lossy])
    # the bare path's own figures are the baseline, not the target
    assert "not measured" in verdict([result("bare", 10000, per_s=10000, cpu=0.5, p99=20.0)])


def test_the_api_target_is_the_list_pages_cpu_as_a_ratio_to_the_minimal_views(bench):
    verdict = bench("api")["cpu_ratio_verdict"]
    assert verdict(50, 3.0, 2.0).endswith("3.00 / 2.00 ms = 1.500x: met")
    assert verdict(50, 4.4, 2.0).endswith("4.40 / 2.00 ms = 2.200x: MISSED")
    assert verdict(50, 4.0, 2.0).endswith("= 2.000x: met")  # at most 2x
    assert verdict(50, 4.01, 2.0).endswith("= 2.005x: MISSED")
    assert "a list page of 50 costs at most 2x" in verdict(50, 4.0, 2.0)


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_the_metrics_bench_prints_the_scaling_table_from_a_real_run(tmp_path):
    """A tiny fleet through the real servers, both paths: the table and the verdict come out
    and every watched sample arrives. On its own Redis and SQLite: the bench flushes its Redis
    database and fills its database, so never the suite's."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    done = subprocess.run(
        [sys.executable, str(BENCH / "metrics.py"), "--runs", "scaling", "--scale", "16",
         "--servers", "1", "--seconds", "2", "--warmup", "3", "--drain", "3",
         "--redis", "embedded", "--json", str(tmp_path / "runs.json")],
        env=env, capture_output=True, text=True, timeout=230,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "samples/s per web core" in done.stdout
    assert "not measured in this run (largest fleet: 16 GPUs)" in done.stdout
    runs = json.loads((tmp_path / "runs.json").read_text())
    assert [(r["run"], r["gpus"], r["viewers"]) for r in runs] == [
        ("agent-16", 16, 16),
        ("bare-16", 16, 16),
    ]
    assert all(r["delivered"] == r["expected"] > 0 and r["lost"] == 0 for r in runs), runs


@pytest.mark.integration
@pytest.mark.skipif(os.geteuid() != 0, reason="bench/volumes.py mounts volumes: root only")
def test_the_volumes_bench_prints_snapshot_and_shelve_times_against_tar_zstd():
    """A small volume through the agent's real snapshot jobs, restic and tar | zstd."""
    done = subprocess.run(
        [sys.executable, str(BENCH / "volumes.py"), "--size-mib", "16"],
        capture_output=True, text=True, timeout=110,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [
        line for line in done.stdout.splitlines() if line.startswith(("| snapshot", "| restore"))
    ]
    assert len(rows) == 2 and all(row.endswith("x |") for row in rows), done.stdout
    assert "tar -c \\| zstd -1" in done.stdout
    assert "| shelve (snapshot + remove) | unshelve (restore) |" in done.stdout
