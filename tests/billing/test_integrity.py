"""The findings of the billing review, one test each: credit notes reverse exactly, an empty
invoice is never numbered, a lost host's billing ends at its last heartbeat whatever was
clicked meanwhile, and an instance never placed has no disk to bill."""

from datetime import timedelta
from decimal import Decimal

import pytest
import time_machine
from hypothesis import given
from hypothesis import strategies as st

from billing import documents, services
from billing.corrections import void_invoice
from billing.credits import grant_credit
from billing.exports import document
from billing.models import Invoice, InvoiceLine, UsageKind, UsagePiece, UsageSegment
from billing.rating import invoice_totals, reversed_totals
from console.fleet.models import Host
from console.instances import outcomes, queue, recovery
from console.instances import services as instances
from console.instances.models import Instance, State
from tests.billing.conftest import at, move, walk
from tests.instances.conftest import Catalog

pytestmark = pytest.mark.django_db
S = State

cents = st.integers(0, 10**6).map(lambda n: Decimal(n) / 100)
micros = st.integers(-(10**9), 10**9).map(lambda n: Decimal(n) / 10**6)


@given(
    lines=st.lists(micros, max_size=6),
    credit=cents,
    tax_rate=st.one_of(st.none(), st.integers(1, 300).map(lambda n: Decimal(n) / 1000)),
)
def test_a_credit_note_reverses_its_invoice_exactly(lines, credit, tax_rate):
    """Finding 4, as a family: whatever the lines, credits and tax, the reversed totals are
    the negation of the invoice's and satisfy lines - credits + tax = total."""
    totals = invoice_totals(lines, credit_available=credit, tax_rate=tax_rate)
    note = reversed_totals(totals)
    assert (note.subtotal, note.credits_applied, note.tax, note.total) == (
        -totals.subtotal,
        -totals.credits_applied,
        -totals.tax,
        -totals.total,
    )
    for amounts in (totals, note):
        assert amounts.subtotal - amounts.credits_applied + amounts.tax == amounts.total
    assert note.total <= 0 or totals.total < 0
    assert str(reversed_totals(invoice_totals([])).total) == "0.00"  # never -0.00


def _issue(world, tenant, seconds: int, price: str) -> Invoice:
    """An invoice of March 2026 with one GPU line of ``seconds`` at ``price`` per hour."""
    from console.catalog.models import SpecPrice

    SpecPrice.objects.create(
        spec=world.whole, effective_from=at(2020, 1, 1), price_per_hour=Decimal(price)
    )
    box = world.running(tenant, at(2026, 3, 3, 8), spec=world.whole)
    move(box, S.TERMINATING, at(2026, 3, 3, 8) + timedelta(seconds=seconds))
    services.run_meter(at(2026, 3, 4))
    services.finalize_month(at(2026, 3, 1).date(), now=at(2026, 4, 1, 2))
    return Invoice.objects.get(tenant=tenant, kind=Invoice.Kind.INVOICE)


def test_voiding_a_fully_credited_invoice_gives_a_zero_credit_note(world, tenant):
    """Finding 4: 3600 s at 10.005/h is 10.005, billed 10.01 and covered by credit; the
    note used to re-round -10.005 + 10.01 = 0.005 up to a positive cent."""
    with time_machine.travel(at(2026, 3, 1), tick=False):
        grant_credit(tenant, "50.00")
    invoice = _issue(world, tenant, 3600, "10.005")
    assert (invoice.subtotal, invoice.credits_applied, invoice.total) == (
        Decimal("10.01"),
        Decimal("10.01"),
        Decimal("0.00"),
    )
    note = void_invoice(invoice, now=at(2026, 4, 2))
    assert (note.subtotal, note.credits_applied, note.tax_amount, note.total) == (
        Decimal("-10.01"),
        Decimal("-10.01"),
        Decimal("0.00"),
        Decimal("0.00"),
    )
    assert [line.amount for line in note.lines.all()] == [Decimal("-10.005000")]
    doc = document(note)  # the document checks lines - credits + tax = total
    parsed = documents.parse_invoice_json(documents.render_invoice_json(doc))
    assert parsed.total == Decimal("0.00")
    assert tenant.credit_grants.get().remaining == Decimal("50.00")  # credit returned


def test_a_credit_note_with_tax_reverses_to_the_cent(world, tenant, settings):
    settings.BILLING_TAX_RATE = "0.19"
    invoice = _issue(world, tenant, 1800, "3.3333")
    note = void_invoice(invoice, now=at(2026, 4, 2))
    assert note.total == -invoice.total and note.tax_amount == -invoice.tax_amount
    assert sum(line.amount for line in note.lines.all()) == -sum(
        line.amount for line in invoice.lines.all()
    )


def test_a_failover_just_before_midnight_leaves_no_numbered_empty_invoice(world, tenant):
    """Finding 5: the meter ran after midnight (a piece of April, so an April draft), then
    the failover closed the segment at the last heartbeat in March."""
    box = world.running(tenant, at(2026, 3, 31, 20))
    services.run_meter(at(2026, 4, 1, 0, 1))
    assert Invoice.objects.filter(tenant=tenant, month=at(2026, 4, 1).date()).exists()
    with time_machine.travel(at(2026, 4, 1, 0, 2), tick=False):
        move(box, S.FAILED, at(2026, 3, 31, 23, 59, 30))
        # terminated at once: a failed instance's disk is billed until then
        move(box, S.TERMINATING, at(2026, 3, 31, 23, 59, 30))
    services.run_meter(at(2026, 4, 1, 0, 3))
    services.finalize_month(at(2026, 3, 1).date(), now=at(2026, 4, 1, 1))
    result = services.finalize_month(at(2026, 4, 1).date(), now=at(2026, 5, 1, 1))
    assert result.invoices == 0 and result.first_number is None
    assert list(Invoice.objects.values_list("month", "number")) == [
        (at(2026, 3, 1).date(), "GC-2026-000001")
    ]
    assert not InvoiceLine.objects.filter(invoice__month=at(2026, 4, 1).date()).exists()


def test_an_instance_stopped_while_queued_has_no_disk_to_bill(world, tenant):
    """Finding 7: budget enforcement stops queued instances; they were never placed."""
    queued = world.instance(tenant, when=at(2026, 3, 1))
    move(queued, S.STOPPED, at(2026, 3, 2))
    services.run_meter(at(2026, 3, 20))
    assert not UsageSegment.objects.filter(instance=queued).exists()
    # the repair from the events agrees (every signal lost)
    lost = world.instance(tenant, when=at(2026, 3, 1))
    move(lost, S.STOPPED, at(2026, 3, 2), deliver=False)
    walk(lost, [S.STARTING, S.RUNNING, S.STOPPING, S.STOPPED], at(2026, 3, 5), deliver=False)
    services.run_meter(at(2026, 3, 6))
    assert [(s.kind, s.started_at) for s in UsageSegment.objects.filter(instance=lost)] == [
        (UsageKind.GPU, at(2026, 3, 5)),
        (UsageKind.DISK, at(2026, 3, 5)),  # after it was placed, not from 2 March
    ]


@pytest.mark.parametrize("deliver", [True, False], ids=["signal", "signal lost"])
def test_a_stop_during_host_silence_bills_up_to_the_last_heartbeat(
    tenant, settings, monkeypatch, django_capture_on_commit_callbacks, deliver
):
    """Finding 6: the host went silent at 10:00; the tenant clicked Stop at 10:05; the
    failover at 10:10 ends billing at 10:00, not at the click."""
    monkeypatch.setattr(queue, "enqueue", lambda *args: None)
    settings.HOST_FAILOVER_SECONDS = 60
    catalog = Catalog()
    host = catalog.host(gpus=1)
    heartbeat = at(2026, 3, 10, 10)
    with time_machine.travel(at(2026, 3, 10, 9), tick=False) as clock:
        with django_capture_on_commit_callbacks(execute=True):
            box = instances.launch_instance(
                tenant, name="box", spec=catalog.quarter, image=catalog.image
            )
            outcomes.mark_running(box.pk, box.current_allocation().pk)
        clock.move_to(at(2026, 3, 10, 10, 5))
        with django_capture_on_commit_callbacks(execute=deliver):
            instances.stop_instance(Instance.objects.get(pk=box.pk))
        clock.move_to(at(2026, 3, 10, 10, 10))
        Host.objects.filter(pk=host.pk).update(
            status=Host.Status.UNREACHABLE,
            unreachable_since=at(2026, 3, 10, 10, 1),
            last_heartbeat_at=heartbeat,
        )
        with django_capture_on_commit_callbacks(execute=True):
            assert recovery.fail_over_hosts() == 1
    assert Instance.objects.get(pk=box.pk).state == S.STOPPED
    services.run_meter(at(2026, 3, 10, 11))
    gpu = UsageSegment.objects.get(instance=box, kind=UsageKind.GPU)
    assert (gpu.started_at, gpu.ended_at) == (at(2026, 3, 10, 9), heartbeat)
    assert sum(p.seconds for p in UsagePiece.objects.filter(instance=box, kind="gpu")) == 3600


def test_repair_rates_each_piece_with_the_spec_disk_and_price_of_its_time(world, tenant, settings):
    """Finding 3: every signal of a box was lost; it ran as a quarter A100, was resized in
    place to a whole A100 (its disk billed for the reboot's minute), then stopped; the disk
    price setting changed since. The repair gives each period the spec it had and the disk
    price of its time."""
    settings.BILLING_DISK_PRICE_PER_GIB_MONTH = Decimal("0.10")
    other = world.running(tenant, at(2026, 3, 1))
    walk(other, [S.STOPPING, S.STOPPED], at(2026, 3, 1, 1))  # its disk segment records 0.10
    box = world.instance(tenant, when=at(2026, 3, 2))
    walk(box, [S.PROVISIONING, S.RUNNING], at(2026, 3, 2, 8), deliver=False)
    Instance.objects.filter(pk=box.pk).update(spec=world.whole)
    box.spec = world.whole  # what resize_instance does before its reboot
    move(box, S.REBOOTING, at(2026, 3, 2, 9), deliver=False)
    move(box, S.RUNNING, at(2026, 3, 2, 9, 1), deliver=False)
    walk(box, [S.STOPPING, S.STOPPED], at(2026, 3, 2, 10), deliver=False)
    settings.BILLING_DISK_PRICE_PER_GIB_MONTH = Decimal("0.20")
    services.run_meter(at(2026, 3, 3))
    segments = UsageSegment.objects.filter(instance=box).order_by("started_at", "kind")
    assert [
        (s.kind, s.spec_id, s.disk_gib, s.disk_price_per_gib_month, s.source) for s in segments
    ] == [
        (UsageKind.GPU, world.quarter.pk, 0, None, "repair"),
        (UsageKind.DISK, world.whole.pk, 200, Decimal("0.10"), "repair"),  # rebooting
        (UsageKind.GPU, world.whole.pk, 0, None, "repair"),
        (UsageKind.DISK, world.whole.pk, 200, Decimal("0.10"), "repair"),
    ]
    gpu = UsagePiece.objects.filter(instance=box, kind=UsageKind.GPU).order_by("start")
    assert [(p.unit_price, p.amount) for p in gpu] == [
        (Decimal("0.9"), Decimal("0.900000")),  # 1 h as a quarter
        (Decimal("3.2"), Decimal("3.146667")),  # 59 min as a whole A100
    ]
