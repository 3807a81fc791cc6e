"""The trace replay of bench/scheduler.py on a tiny trace of the same format."""

import json
import runpy
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "scheduler.py"

NODES = """sn,cpu_milli,memory_mib,gpu,model
node-0,32000,131072,2,T4
node-1,8000,32768,1,P100
"""
# no creation_time column: file order; the demand reaches the 3 GPUs with the last pod
PODS = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec
pod-0,4000,8192,1,500,
pod-1,2000,4096,0,0,
pod-2,8000,8192,2,1000,T4|P100
pod-3,2000,8192,1,500,
"""


def test_the_replay_reports_every_policy(tmp_path, capsys):
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(PODS)
    main = runpy.run_path(str(BENCH))["main"]
    main(["--nodes", str(tmp_path / "nodes.csv"), "--pods", str(tmp_path / "pods.csv"), "--json"])
    results = json.loads(capsys.readouterr().out)
    # first-fit splits a T4 for pod-0, and pod-2 then finds no two unused GPUs on one host
    allocated = {"first-fit": 1.0, "best-fit": 3.0, "fgd": 3.0}
    assert {policy: r["allocated_gpus"] for policy, r in results.items()} == allocated
    for result in results.values():
        assert result["capacity_gpus"] == 3
        assert result["requests"] == 4
        assert result["unallocated_share"] == 1 - result["allocated_gpus"] / 3
        assert result["decisions_per_s"] > 0
        assert result["decisions_per_cpu_s"] > 0


def test_a_repeated_replay_places_alike_and_keeps_the_fastest(tmp_path, capsys):
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(PODS)
    main = runpy.run_path(str(BENCH))["main"]
    files = ["--nodes", str(tmp_path / "nodes.csv"), "--pods", str(tmp_path / "pods.csv")]
    main([*files, "--json", "--policies", "fgd", "--repeat", "3"])
    (result,) = json.loads(capsys.readouterr().out).values()
    assert result["allocated_gpus"] == 3.0 and result["requests"] == 4
    assert result["decisions_per_cpu_s"] > 0


def test_fractions_redraw_only_the_fractional_requests(tmp_path):
    (tmp_path / "pods.csv").write_text(PODS)
    read_requests = runpy.run_path(str(BENCH))["read_requests"]
    requests = read_requests(tmp_path / "pods.csv", [125, 333], seed=3)
    fractional = [(r.milli, demand) for r, demand in requests if r.gpu_count == 1]
    assert len(fractional) == 2
    assert all(milli in (125, 333) and demand == milli for milli, demand in fractional)
    # the vCPU-only pod and the two whole GPUs are as in the file
    assert [(r.gpu_count, r.milli, d) for r, d in requests][1:3] == [(0, 0, 0), (2, 1000, 2000)]


def test_the_dynamic_replay_queues_what_does_not_fit_until_capacity_leaves(tmp_path, capsys):
    (tmp_path / "nodes.csv").write_text(
        "sn,cpu_milli,memory_mib,gpu,model\nnode-0,32000,131072,2,T4\n"
    )
    # pod-1 wants both GPUs while pod-0 holds one: it waits from 10 until pod-0 leaves at 100
    (tmp_path / "pods.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time\n"
        "pod-0,4000,8192,1,1000,0,100\n"
        "pod-1,4000,8192,2,1000,10,30\n"
        "pod-2,2000,4096,0,0,40,50\n"
    )
    main = runpy.run_path(str(BENCH))["main"]
    args = ["--nodes", str(tmp_path / "nodes.csv"), "--pods", str(tmp_path / "pods.csv")]
    main([*args, "--dynamic", "--json"])
    for result in json.loads(capsys.readouterr().out).values():
        assert result["allocated_share"] == 0.5  # one GPU of two from 0 to the last arrival
        assert (result["wait_p50_s"], result["wait_p99_s"], result["wait_max_s"]) == (0, 90, 90)
        assert result["never_placed"] == 0


def test_the_dynamic_replay_needs_the_trace_times(tmp_path):
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(PODS)
    main = runpy.run_path(str(BENCH))["main"]
    args = ["--nodes", str(tmp_path / "nodes.csv"), "--pods", str(tmp_path / "pods.csv")]
    with pytest.raises(SystemExit, match="no creation_time"):
        main([*args, "--dynamic"])


def test_a_load_spaces_that_many_arrivals_evenly(tmp_path, capsys):
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time\n"
        "pod-0,4000,8192,1,500,0,100\n"
        "pod-1,2000,4096,2,1000,5000,5100\n"
    )
    stream = runpy.run_path(str(BENCH))["stream"]
    read_jobs = runpy.run_path(str(BENCH))["read_jobs"]
    jobs = stream(read_jobs(tmp_path / "pods.csv", None, 1), 3000, 1.0, 6, seed=1)
    assert len(jobs) == 6
    assert [job.duration for job in jobs[:2]] == [100, 100]
    gaps = {b.arrival - a.arrival for a, b in zip(jobs, jobs[1:], strict=False)}
    assert max(gaps) - min(gaps) <= 1  # evenly spaced, whatever the file's times
    # GPU time asked for within the span, over the cluster's: the load asked for
    span = jobs[-1].arrival + (jobs[1].arrival - jobs[0].arrival)
    asked = sum(job.demand * min(job.duration, span) for job in jobs)
    assert abs(asked / (3000 * span) - 1.0) < 0.05


def test_a_fraction_mix_is_measured_beside_the_files_own_fractions(tmp_path, capsys):
    (tmp_path / "nodes.csv").write_text(NODES)
    (tmp_path / "pods.csv").write_text(PODS)
    main = runpy.run_path(str(BENCH))["main"]
    args = ["--nodes", str(tmp_path / "nodes.csv"), "--pods", str(tmp_path / "pods.csv")]
    main([*args, "--fractions", "--policies", "best-fit,fgd"])
    table = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in table if line.startswith(("file's", "11 fractions "))]
    assert [row[:3] for row in rows] == [
        ["file's", "fractions", "best-fit"],
        ["file's", "fractions", "fgd"],
        ["11", "fractions", "best-fit"],
        ["11", "fractions", "fgd"],
    ]
    assert all(row[-2] == "(baseline)" for row in rows[:2])
    assert all(row[-2].endswith("x") and float(row[-2][:-1]) > 0 for row in rows[2:])
    assert table[-1] == "11 fractions: 100,125,200,250,300,333,460,500,600,750,810 milli-GPU"

    main([*args, "--fractions", "125,333", "--json"])
    for result in json.loads(capsys.readouterr().out).values():
        baseline = result["baseline"]
        assert baseline["requests"] == 4  # the file as it is: its demand reaches capacity
        assert result["decisions_per_cpu_s_vs_baseline"] == (
            result["decisions_per_cpu_s"] / baseline["decisions_per_cpu_s"]
        )
        assert result["unallocated_vs_best_fit"] >= 0
