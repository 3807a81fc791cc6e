"""The trace replay of bench/scheduler.py on a tiny trace of the same format."""

import json
import runpy
from pathlib import Path

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


def test_fractions_redraw_only_the_fractional_requests(tmp_path):
    (tmp_path / "pods.csv").write_text(PODS)
    read_requests = runpy.run_path(str(BENCH))["read_requests"]
    requests = read_requests(tmp_path / "pods.csv", [125, 333], seed=3)
    fractional = [(r.milli, demand) for r, demand in requests if r.gpu_count == 1]
    assert len(fractional) == 2
    assert all(milli in (125, 333) and demand == milli for milli, demand in fractional)
    # the vCPU-only pod and the two whole GPUs are as in the file
    assert [(r.gpu_count, r.milli, d) for r, d in requests][1:3] == [(0, 0, 0), (2, 1000, 2000)]
