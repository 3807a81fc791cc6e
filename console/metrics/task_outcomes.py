"""Celery task outcomes and billing job runs, counted where the task runs (a worker's pool
process, or the caller in eager mode) into the counters every web process's /metrics reads
(console.metrics.counters: Redis, shared by every process). Connected by MetricsConfig.ready,
which every worker runs as it sets Django up.

- `gpucloud_celery_tasks_total{task, outcome}`: outcome is succeeded, failed or retried.
- `gpucloud_billing_job_runs_total{job, outcome}`, `gpucloud_billing_job_duration_seconds{job}`
  (a histogram) and `gpucloud_billing_job_last_success_timestamp_seconds{job}` for the
  metering and invoice-finalizing jobs."""

import time

from celery import signals

from console.metrics import counters

BILLING_JOBS = {
    "billing.tasks.meter": "meter",
    "billing.tasks.finalize_invoices": "finalize_invoices",
}
# Celery's end state of a run → our outcome.
_OUTCOMES = {"SUCCESS": "succeeded", "FAILURE": "failed", "RETRY": "retried"}

# task id → when its run began (monotonic), while it runs in this process.
_started: dict[str, float] = {}


def _outcome(task_name: str, outcome: str) -> None:
    counters.count("gpucloud_celery_tasks_total", {"task": task_name, "outcome": outcome})


def on_success(sender=None, **kwargs) -> None:
    _outcome(sender.name, "succeeded")


def on_failure(sender=None, **kwargs) -> None:
    _outcome(sender.name, "failed")


def on_retry(sender=None, **kwargs) -> None:
    _outcome(sender.name, "retried")


def on_prerun(task_id=None, task=None, **kwargs) -> None:
    if task.name in BILLING_JOBS:
        _started[task_id] = time.monotonic()


def on_postrun(task_id=None, task=None, state=None, **kwargs) -> None:
    began = _started.pop(task_id, None)
    if began is None:
        return
    job = BILLING_JOBS[task.name]
    outcome = _OUTCOMES.get(state, "failed")
    counters.count("gpucloud_billing_job_runs_total", {"job": job, "outcome": outcome})
    counters.observe(
        "gpucloud_billing_job_duration_seconds", {"job": job}, time.monotonic() - began
    )
    if outcome == "succeeded":
        last = "gpucloud_billing_job_last_success_timestamp_seconds"
        counters.put(last, {"job": job}, time.time())


def connect() -> None:
    signals.task_success.connect(on_success, weak=False, dispatch_uid="metrics-task-success")
    signals.task_failure.connect(on_failure, weak=False, dispatch_uid="metrics-task-failure")
    signals.task_retry.connect(on_retry, weak=False, dispatch_uid="metrics-task-retry")
    signals.task_prerun.connect(on_prerun, weak=False, dispatch_uid="metrics-task-prerun")
    signals.task_postrun.connect(on_postrun, weak=False, dispatch_uid="metrics-task-postrun")
