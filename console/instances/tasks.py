"""Celery tasks: every transition that touches a host, the scheduler and reconcile.

Host tasks take the instance's primary key, read what to do under the instance's lock
(outcomes.job), return quietly when the instance has moved on (a redelivery), call the agent
outside any transaction with the allocation id (so a repeated call is harmless), and record
the outcome through services. Transient agent errors are retried with exponential backoff;
when the retries run out, or the agent refuses, the instance ends `failed` with the reason.
acks_late + reject_on_worker_lost (global settings) bring a task back when a worker dies."""

import logging
from datetime import UTC

from celery import Task, shared_task
from celery.utils.time import get_exponential_backoff_interval
from django.conf import settings
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from console.fleet import agent_client
from console.fleet.agent_client import (
    RETRIED_WHILE_UNAVAILABLE,
    AgentError,
    AgentRejected,
    AgentUnavailable,
)
from console.fleet.models import Host
from console.instances import (
    access,
    hooks,
    lifecycle,
    outcomes,
    placement,
    queue,
    recovery,
    restarts,
)
from console.instances.models import Allocation, State
from console.instances.reasons import Code, Reason
from console.registry_credentials import services as registry_credentials

log = logging.getLogger(__name__)

S = State


class HostTask(Task):
    """Base of the tasks that call an agent for one instance (first argument: its pk)."""

    autoretry_for = (AgentUnavailable,)
    retry_backoff = settings.INSTANCE_AGENT_RETRY_BACKOFF
    retry_backoff_max = settings.INSTANCE_AGENT_RETRY_BACKOFF_MAX
    retry_jitter = True
    max_retries = settings.INSTANCE_AGENT_MAX_RETRIES
    acks_late = True
    reject_on_worker_lost = True

    def retry_later(self, exc: Exception):
        """Retry like autoretry does, for errors that are transient only here (a 409 while
        an earlier allocation of the same slice is being torn down)."""
        countdown = get_exponential_backoff_interval(
            factor=self.retry_backoff,
            retries=self.request.retries,
            maximum=self.retry_backoff_max,
            full_jitter=self.retry_jitter,
        )
        return self.retry(exc=exc, countdown=countdown)

    def on_retry(self, exc, task_id, args, kwargs, einfo):
        attempt = self.request.retries + 1
        outcomes.note_retry(
            args[0],
            f"Its host is not answering ({exc}); trying again, {attempt} of {self.max_retries}",
        )

    def on_failure(self, exc, task_id, args, kwargs, einfo):
        if isinstance(exc, AgentUnavailable) and recovery.wait_for_host(args[0]):
            return
        detail = str(exc)
        if isinstance(exc, AgentUnavailable):
            reason = Reason(
                Code.AGENT_UNAVAILABLE, f"gave up after {self.max_retries} retries: {detail}"
            )
        elif isinstance(exc, AgentRejected):
            reason = Reason(Code.AGENT_REJECTED, detail)
        else:
            where = f"{exc.__class__.__name__} in {self.name.rsplit('.', 1)[-1]}"
            reason = Reason(Code.INTERNAL_ERROR, where)
        log.warning("instance %s failed in %s: %s", args[0], self.name, detail)
        outcomes.fail_instance(args[0], reason)


def _outcome(allocation_id: str, item: dict) -> outcomes.Outcome:
    """An agent's view of an allocation (a call's answer, or an item of its listing)."""
    exit_code = item.get("exit_code")
    try:
        at = parse_datetime(str(item.get("finished_at") or ""))
    except ValueError:
        at = None
    if at is not None and timezone.is_naive(at):
        at = timezone.make_aware(at, UTC)
    return outcomes.Outcome(
        allocation_id=allocation_id,
        state=str(item.get("state") or ""),
        reason=str(item.get("reason") or ""),
        exit_code=exit_code if isinstance(exit_code, int) else None,
        at=at,
        image_digest=str(item.get("image_digest") or ""),
    )


def _settle(job: outcomes.Job, result: dict, running_message: str) -> bool:
    """Record the agent's answer to a start: the workload ended at once (exited, failed,
    lost), is still starting (its event, or reconcile, completes it), or runs. Answers
    False when the instance is no longer this allocation's (it moved on meanwhile)."""
    outcome = _outcome(job.allocation_id, result)
    if outcome.state in outcomes.ENDED:
        outcomes.record_outcome(job.host, job.instance_pk, outcome)
        return True
    if outcome.state == "starting":
        outcomes.record_progress(
            job.host, job.instance_pk, job.allocation_id, "Starting the workload on its host"
        )
        return True
    return outcomes.mark_running(
        job.instance_pk, job.allocation_id, running_message, image_digest=outcome.image_digest
    )


def _put(task: HostTask, job: outcomes.Job) -> dict:
    try:
        auth = registry_credentials.pull_auth(job.tenant_id, job.request.get("image") or "")
        body = placement.agent_body(job.request, job.secret_env, auth)
        return agent_client.create_allocation(job.host, job.allocation_id, body)
    except AgentRejected as exc:
        if exc.status == 409:
            raise task.retry_later(exc) from exc
        raise


def _discard(allocation_id: str) -> None:
    """Best effort: an allocation the database no longer owns leaves its host (reconcile
    would remove it otherwise)."""
    allocation = Allocation.objects.select_related("host").filter(pk=allocation_id).first()
    if allocation is None or allocation.released_at is None:
        return
    try:
        agent_client.delete_allocation(allocation.host, allocation.pk)
    except AgentError as exc:
        log.info("could not remove released allocation %s: %s", allocation_id, exc)


@shared_task(base=HostTask, bind=True, name="console.instances.tasks.provision")
def provision(self, instance_pk: int) -> None:
    """provisioning/starting → running: give its host the keys that open its shells, then
    create the allocation there."""
    job = outcomes.job(instance_pk, (S.PROVISIONING, S.STARTING))
    if job is None or job.allocation_id is None:
        return
    if hooks.provision_held(instance_pk, job.host):
        return
    agent_client.set_ssh_keys(
        job.host, instance_pk, access.granted_keys(instance_pk), access.granted_members(instance_pk)
    )
    result = _put(self, job)
    if not _settle(job, result, "Running"):
        _discard(job.allocation_id)


@shared_task(base=HostTask, bind=True, name="console.instances.tasks.stop")
def stop(self, instance_pk: int) -> None:
    """stopping → stopped: stop the workload, then delete the allocation so that the slice
    is free on the host too."""
    job = outcomes.job(instance_pk, (S.STOPPING,))
    if job is None:
        return
    if job.allocation_id is not None:
        try:
            agent_client.allocation_action(job.host, job.allocation_id, "stop")
        except AgentRejected as exc:
            if exc.status != 404:  # already gone: a redelivery after the delete below
                raise
        agent_client.delete_allocation(job.host, job.allocation_id)
    outcomes.finish_stop(instance_pk)


@shared_task(base=HostTask, bind=True, name="console.instances.tasks.reboot")
def reboot(self, instance_pk: int) -> None:
    """rebooting → running."""
    job = outcomes.job(instance_pk, (S.REBOOTING,))
    if job is None or job.allocation_id is None:
        return
    result = agent_client.allocation_action(job.host, job.allocation_id, "reboot")
    _settle(job, result, "Running after reboot")


@shared_task(base=HostTask, bind=True, name="console.instances.tasks.resize")
def resize(self, instance_pk: int, old_allocation_id: str) -> None:
    """A resize in place (rebooting → running): the old allocation leaves the GPU, the new
    one, already committed on the same GPU, takes its place."""
    job = outcomes.job(instance_pk, (S.REBOOTING,))
    if job is None or job.allocation_id is None:
        return
    old = Allocation.objects.select_related("host").filter(pk=old_allocation_id).first()
    if old is not None and old.pk != job.allocation_id:
        agent_client.delete_allocation(old.host, old.pk)
    result = _put(self, job)
    _settle(job, result, "Running, resized")


@shared_task(base=HostTask, bind=True, name="console.instances.tasks.set_limits")
def set_limits(self, instance_pk: int, allocation_id: str, old_spec_pk: int) -> None:
    """A live resize (running, and it stays so): the agent changes the running container's
    CPU and memory limits. Refused (the engine could not): back to the old spec."""
    job = outcomes.job(instance_pk, (S.RUNNING,))
    if job is None or job.allocation_id != allocation_id:
        return
    limits = placement.live_limits(job.request)
    try:
        agent_client.set_limits(job.host, allocation_id, limits)
    except AgentRejected as exc:
        outcomes.undo_live_resize(instance_pk, allocation_id, old_spec_pk, exc.message)


@shared_task(base=HostTask, bind=True, name="console.instances.tasks.terminate")
def terminate(self, instance_pk: int) -> None:
    """terminating → terminated: every allocation of the instance leaves its host."""
    job = outcomes.job(instance_pk, (S.TERMINATING,))
    if job is None:
        return
    for allocation in outcomes.allocations_to_tear_down(instance_pk):
        agent_client.delete_allocation(allocation.host, allocation.pk)
    message = "Terminated"
    disk_host = outcomes.disk_to_delete(instance_pk)
    if disk_host is not None and disk_host.status in (Host.Status.UNREACHABLE, Host.Status.RETIRED):
        message = f"Terminated; its disk on {disk_host.name} ({disk_host.status}) stays there"
    elif disk_host is not None:
        kept = outcomes.kept_disk(instance_pk)
        if kept is not None:  # it is a volume's now: the instance's delete leaves it
            agent_client.adopt_disk(
                disk_host, kept.disk_name, instance_pk, kept.owner, kept.tenant_id
            )
        try:
            agent_client.delete_instance_data(disk_host, instance_pk)
        except AgentRejected as exc:
            if exc.status == 409:  # an allocation of it is still being torn down there
                raise self.retry_later(exc) from exc
            raise
    outcomes.finish_terminate(instance_pk, message)


@shared_task(
    name="console.instances.tasks.push_ssh_keys",
    **RETRIED_WHILE_UNAVAILABLE,
)
def push_ssh_keys(instance_pk: int) -> bool:
    """The keys the instance grants changed (a key deleted, a member lowered to viewer or
    removed): its host lets in exactly the ones left, and ends the terminals of members gone.
    Nothing to do when it is on no host (the next provision pushes them); the instance's state
    is not touched either way."""
    job = outcomes.job(instance_pk, tuple(lifecycle.ON_HOST))
    if job is None or job.host is None:
        return False
    agent_client.set_ssh_keys(
        job.host, instance_pk, access.granted_keys(instance_pk), access.granted_members(instance_pk)
    )
    return True


@shared_task(name="console.instances.tasks.restart")
def restart(instance_pk: int, due: str) -> bool:
    """Start again an instance whose workload ended, its restart's backoff over."""
    return restarts.restart(instance_pk, due)


@shared_task(name="console.instances.tasks.schedule_pending")
def schedule_pending() -> int:
    """Fail over silent hosts, then place queued instances (priority, then age)."""
    recovery.fail_over_hosts()
    return queue.schedule_pending()


@shared_task(name="console.instances.tasks.reconcile")
def reconcile() -> None:
    """Compare the database with every reachable agent, one task per host."""
    recovery.fail_over_hosts()
    recovery.requeue_stuck()
    hosts = Host.objects.exclude(
        status__in=(Host.Status.UNREACHABLE, Host.Status.RETIRED)
    ).values_list("pk", flat=True)
    for host_pk in hosts:
        reconcile_host.delay(host_pk)


# States whose allocation ran on its host: one that vanished from there fails the instance.
RAN = (S.RUNNING, S.UNREACHABLE)


@shared_task(name="console.instances.tasks.reconcile_host")
def reconcile_host(host_pk: int) -> dict:
    """Mend drift between one agent and the database: an allocation on the agent that no
    instance owns is settled (recovery.settle_orphan: removed when the console ended it,
    otherwise stopped and reported, never deleted); an unreachable instance the agent still
    runs is adopted back; what the agent reports of the others is applied as its events
    would have been (running, exited, failed, lost: an event lost on the way); a running or
    unreachable instance whose allocation vanished from the agent is marked failed; a launch
    whose allocation never reached the agent (its worker died) is queued again. Nothing while
    the host's container engine does not answer: the agent's listing is stale then."""
    host = Host.objects.filter(pk=host_pk).first()
    if host is None or host.status in (Host.Status.UNREACHABLE, Host.Status.RETIRED):
        return {}
    if host.engine_down_since is not None:  # its agent cannot read its workloads now
        return {}
    # List the agent before reading the database: any allocation the agent lists had its row
    # committed before it was created, so it is either owned below or truly released.
    listed_at = timezone.now()
    try:
        reported = agent_client.list_allocations(host)
    except AgentError as exc:
        log.info("reconcile: %s", exc)
        return {}
    owned = recovery.owned_allocations(host)
    removed, stopped, failed, redriven, adopted = [], [], [], [], []
    for item in reported:
        alloc_id = item.get("id")
        allocation = owned.get(alloc_id)
        if allocation is None:
            try:
                settled = recovery.settle_orphan(host, item)
            except AgentError as exc:
                log.info("reconcile: could not settle %s: %s", alloc_id, exc)
                continue
            if settled == "removed":
                removed.append(alloc_id)
            elif settled == "stopped":
                stopped.append(alloc_id)
            continue
        outcome = _outcome(alloc_id, item)
        if outcome.state == "running" and recovery.adopt(host, allocation.instance_id, alloc_id):
            adopted.append(allocation.instance_id)
            continue
        changed = outcome.state in ("running", *outcomes.ENDED) and outcomes.record_outcome(
            host, allocation.instance_id, outcome
        )
        if changed and outcome.state in ("failed", "lost"):
            failed.append(allocation.instance_id)
    seen = {item.get("id") for item in reported}
    for alloc_id, allocation in owned.items():
        instance = allocation.instance
        if alloc_id not in seen and recovery.redrive_launch(allocation, listed_at):
            redriven.append(instance.pk)
        if alloc_id in seen or instance.state not in RAN or instance.updated_at >= listed_at:
            continue
        if outcomes.fail_instance(
            instance.pk,
            Reason(Code.ALLOCATION_VANISHED, f"allocation {alloc_id} is no longer on its host"),
            allocation_id=alloc_id,
            only_states=RAN,
        ):
            failed.append(instance.pk)
    repairs = {
        "removed": removed,
        "stopped": stopped,
        "failed": failed,
        "redriven": redriven,
        "adopted": adopted,
    }
    done = repairs_done(repairs)
    if done:
        log.info("reconcile host %s: %s", host.name, done)
    else:
        log.debug("reconcile host %s: nothing to mend", host.name)
    return repairs


# What each list of reconcile_host's repairs holds, for its log line.
REPAIRED = {
    "redriven": ("redriven", "launch", "instance"),
    "adopted": ("adopted back", "instance", "instance"),
    "failed": ("marked failed", "instance", "instance"),
    "removed": ("removed", "orphan allocation", "allocation"),
    "stopped": ("stopped", "orphan allocation", "allocation"),
}


def repairs_done(repairs: dict[str, list]) -> str:
    """Reconcile's repairs in words, e.g. "redriven 2 launches (instances 4, 5)"; "" when
    there were none."""
    said = []
    for key, (verb, noun, label) in REPAIRED.items():
        items = repairs.get(key) or []
        if items:
            many = len(items) > 1
            nouns = noun + ("es" if noun.endswith("h") else "s") if many else noun
            listed = ", ".join(str(item) for item in sorted(items))
            said.append(f"{verb} {len(items)} {nouns} ({label}{'s' if many else ''} {listed})")
    return "; ".join(said)
