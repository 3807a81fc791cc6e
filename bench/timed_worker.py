"""A Celery worker as `make run` starts it (its arguments are console.processes.worker_cmd's
after `-m celery`) that also writes, for bench/launch.py's breakdown, one JSON line per
provision task run to the file BENCH_TIMINGS names: the instance, when the task started and
ended, and when each of its agent calls started and ended (wall-clock seconds).

    python bench/timed_worker.py -A console worker -Q … (BENCH_TIMINGS=/tmp/timings.jsonl)
"""

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from celery.signals import task_postrun, task_prerun, worker_process_init  # noqa: E402

PROVISION = "console.instances.tasks.provision"
TIMED_CALLS = ("set_ssh_keys", "create_allocation")
current: dict = {}


@worker_process_init.connect
def time_agent_calls(**_) -> None:
    """In each pool process: the agent calls a provision task makes note their times."""
    from console.fleet import agent_client

    for name in TIMED_CALLS:
        call = getattr(agent_client, name)

        def timed(*args, _call=call, _name=name, **kwargs):
            started = time.time()
            try:
                return _call(*args, **kwargs)
            finally:
                current.setdefault("calls", []).append([_name, started, time.time()])

        setattr(agent_client, name, timed)


@task_prerun.connect
def started(task=None, args=None, **_) -> None:
    current.clear()
    if task is not None and task.name == PROVISION:
        current.update(instance=args[0], started=time.time())


@task_postrun.connect
def ended(task=None, state=None, **_) -> None:
    if task is None or task.name != PROVISION or "instance" not in current:
        return
    line = json.dumps({**current, "ended": time.time(), "state": state})
    with open(os.environ["BENCH_TIMINGS"], "a") as out:
        out.write(line + "\n")


if __name__ == "__main__":
    from celery.__main__ import main

    sys.argv = ["celery", *sys.argv[1:]]
    sys.exit(main())
