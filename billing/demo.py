"""The demo's billing history (``seed_demo``): Acme's instances of the two months before this
one, run through the real lifecycle, metered and finalized as the month-end job would, so a
fresh install's invoice pages and exports show real documents: the older month's invoice paid,
last month's issued and numbered. Loading it again changes nothing."""

from dataclasses import dataclass
from datetime import date, datetime, timedelta

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from accounts.models import Tenant
from billing import corrections, finalize, metering
from billing.models import Invoice, month_bounds
from billing.rating import month_start
from console.catalog.demo import REGION
from console.catalog.models import Image, Region, Spec
from console.instances import lifecycle
from console.instances.models import Instance, State

S = State
TENANT = "acme"
ACTOR = "alice"
IMAGE = "demo-busybox"


@dataclass(frozen=True)
class Run:
    """An instance of the demo's history: launched ``months_ago`` months back on ``day`` at
    ``hour``; each run is (hours running, hours stopped after it), then it is terminated."""

    name: str
    spec: str
    months_ago: int
    day: int
    hour: int
    runs: tuple[tuple[float, float], ...]


HISTORY = [
    Run("bert-finetune", "a100-quarter", 2, 4, 9, ((6, 0),)),
    Run("llama-eval", "h100-80gb-x1", 2, 12, 14, ((3, 0),)),
    Run("sdxl-train", "a100-80gb-x1", 1, 3, 8, ((10, 48), (5, 0))),
    Run("vllm-bench", "l4-x1", 1, 17, 10, ((4.5, 0),)),
]


def _month(now: datetime, months_ago: int) -> datetime:
    start = month_start(now)
    for _ in range(months_ago):
        start = month_start(start - timedelta(days=1))
    return start


def _play(run: Run, tenant: Tenant, actor, now: datetime) -> int:
    """The run's instance and its whole life, as the lifecycle records it (the billing
    receivers open and close its segments once the transaction commits). Answers its pk."""
    at = _month(now, run.months_ago) + timedelta(days=run.day - 1, hours=run.hour)
    spec = Spec.objects.get(code=run.spec)
    with transaction.atomic():
        instance = Instance.objects.create(
            tenant=tenant,
            created_by=actor,
            name=run.name,
            spec=spec,
            image=Image.objects.get(name=IMAGE),
            region=Region.objects.get(code=REGION[0]),
            disk_gib=spec.disk_gib,
            created_at=at,
            updated_at=at,
        )
        lifecycle.record_created(instance, actor=actor)
        steps = [(S.PROVISIONING, at), (S.RUNNING, at + timedelta(seconds=40))]
        at += timedelta(seconds=40)
        for index, (running, stopped) in enumerate(run.runs):
            at += timedelta(hours=running)
            if stopped:
                steps += [(S.STOPPING, at), (S.STOPPED, at + timedelta(seconds=8))]
                at += timedelta(hours=stopped)
                steps += [(S.STARTING, at), (S.RUNNING, at + timedelta(seconds=30))]
                at += timedelta(seconds=30)
            elif index == len(run.runs) - 1:
                steps += [(S.TERMINATING, at), (S.TERMINATED, at + timedelta(seconds=5))]
        for state, when in steps:
            lifecycle.transition(instance, state, actor=actor, at=when)
    return instance.pk


def _finalize(tenant: Tenant, month: date, now: datetime) -> Invoice | None:
    """The month's invoice of the tenant, finalized as the month-end job would have (at the
    month's end plus the grace) once that moment has passed."""
    issue_at = month_bounds(month)[1] + finalize.finalize_grace()
    mine = Invoice.objects.filter(tenant=tenant, month=month, kind=Invoice.Kind.INVOICE)
    if issue_at <= now and not mine.exclude(status=Invoice.Status.DRAFT).exists():
        finalize.finalize_month(month, now=issue_at)
    return mine.first()


def load_history(now: datetime | None = None) -> list[Invoice]:
    """Play what is missing of ``HISTORY``, finalize the months it ran in and mark all but
    the last one's invoice paid (ten days after issue). Answers Acme's invoices of those
    months, oldest first."""
    now = now or timezone.now()
    tenant = Tenant.objects.get(slug=TENANT)
    actor = get_user_model().objects.get(username=ACTOR)
    names = [run.name for run in HISTORY]
    played = set(
        Instance.objects.filter(tenant=tenant, name__in=names).values_list("name", flat=True)
    )
    new = [_play(run, tenant, actor, now) for run in HISTORY if run.name not in played]
    # The receivers made the segments as each transaction committed; a transaction of the
    # caller's would have held them back: bring them in line with the events either way.
    metering.reconcile_instances(new)
    months = sorted(
        {
            month_start(created).date()
            for created in Instance.objects.filter(tenant=tenant, name__in=names).values_list(
                "created_at", flat=True
            )
        }
    )
    issued = []
    for month in months:
        invoice = _finalize(tenant, month, now)
        if invoice is None:
            continue
        if month != months[-1] and invoice.status == Invoice.Status.FINALIZED:
            invoice = corrections.mark_paid(invoice, now=invoice.issued_at + timedelta(days=10))
        issued.append(invoice)
    return issued
