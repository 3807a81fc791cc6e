"""The fleet and host pages name who holds each GPU (tenant and instance, linked) and the
instances waiting for a host, in a number of queries that does not grow with them."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from console.catalog.models import Mode
from console.instances.models import Allocation, GpuClaim, Instance
from tests.factories import (
    GpuModelFactory,
    ImageFactory,
    RegionFactory,
    SpecFactory,
    TenantFactory,
    mig_profile,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def hold(region):
    """Give `tenant` an instance that holds `slots` (MIG) or `milli` (shared) of `gpu`."""
    image = ImageFactory()
    counter = iter(range(1000))

    def do(gpu, tenant, name, slots=(), milli=0, state="running"):
        n = next(counter)
        if slots:
            profile = mig_profile(gpu.model, {1: "1g.10gb", 2: "2g.20gb", 4: "3g.40gb"}[len(slots)])
            spec = SpecFactory(gpu_model=gpu.model, mode=Mode.MIG, mig_profile=profile, milli=None)
        else:
            spec = SpecFactory(gpu_model=gpu.model, mode=Mode.SHARED, milli=milli)
        instance = Instance.objects.create(
            tenant=tenant, name=name, spec=spec, image=image, region=region, state=state
        )
        allocation = Allocation.objects.create(
            id=f"alloc-{n}", instance=instance, host=gpu.host, mode=gpu.mode
        )
        for slot in slots or [None]:
            GpuClaim.objects.create(allocation=allocation, gpu=gpu, slot=slot, milli=milli)
        return instance

    return do


@pytest.fixture
def queue(region, a100):
    """A pending instance of `tenant`, waiting for `disk_host` or for any host of its region."""
    image = ImageFactory()
    spec = SpecFactory(code="a100-quarter", name="A100 · 1/4", gpu_model=a100)

    def do(tenant, name, disk_host=None, in_region=region, spec=spec, reason=""):
        return Instance.objects.create(
            tenant=tenant, name=name, spec=spec, image=image, region=in_region,
            disk_host=disk_host, state_reason_detail=reason,
        )  # fmt: skip

    return do


def change(kind: str, pk: int) -> str:
    return {"instance": f"/admin/instances/instance/{pk}/change/",
            "tenant": f"/admin/accounts/tenant/{pk}/change/"}[kind]  # fmt: skip


def test_fleet_page_names_the_holders_and_the_waiting(register, hold, queue, staff_client):
    host_a, _ = register("host-a", gpus=2)
    host_b, _ = register("host-b", gpus=2, mode="shared")
    acme, globex = (
        TenantFactory(slug="acme", name="Acme AI"),
        TenantFactory(slug="globex", name="Globex"),
    )
    trainer = hold(host_a.gpus.get(index=0), acme, "trainer", slots=(0, 1, 2, 3))
    notebook = hold(host_b.gpus.get(index=1), globex, "notebook", milli=250)
    hold(host_b.gpus.get(index=1), acme, "inference", milli=500, state="stopping")
    waiting = queue(
        globex, "big-job", reason="Waiting for capacity: no A100 · 1/4 free in Local 1."
    )

    page = staff_client.get("/fleet/").content.decode()

    assert "750/1000 milli" in page and "4/8 slices" in page
    assert f'href="{change("instance", trainer.pk)}"' in page
    assert f'href="{change("tenant", acme.pk)}"' in page
    assert f'href="{change("instance", notebook.pk)}"' in page
    assert f'href="{change("tenant", globex.pk)}"' in page
    assert "3g.40gb slices 0–3 · running" in page
    assert "250 milli · running" in page and "500 milli · stopping" in page
    waiting_card = page[page.index('data-testid="waiting"') :]
    waiting_card = waiting_card[: waiting_card.index('data-testid="host-')]
    assert (
        "Waiting for a host" in waiting_card
        and f'href="{change("instance", waiting.pk)}"' in waiting_card
    )
    assert "big-job" in waiting_card and "any host in local-1" in waiting_card
    assert "no A100 · 1/4 free in Local 1" in waiting_card
    assert "trainer" not in waiting_card  # running instances do not wait
    # The links open for the operator.
    assert staff_client.get(change("instance", trainer.pk)).status_code == 200
    assert staff_client.get(change("tenant", acme.pk)).status_code == 200


def test_no_holders_no_waiting_says_so(register, staff_client):
    register("host-a", gpus=1)
    page = staff_client.get("/fleet/").content.decode()
    assert "No instance is waiting." in page
    assert 'data-testid="holders-host-a-gpu0"><span class="muted">—</span>' in page


def test_host_page_lists_its_holders_and_who_waits_for_it(register, hold, queue, staff_client):
    host_a, _ = register("host-a", gpus=2)
    host_b, _ = register("host-b", gpus=2)
    acme = TenantFactory(slug="acme", name="Acme AI")
    holder = hold(host_a.gpus.get(index=1), acme, "trainer", slots=(4, 5))
    hold(host_b.gpus.get(index=0), acme, "elsewhere", slots=(0,))
    its_disk = queue(acme, "restart-me", disk_host=host_a)
    any_host = queue(acme, "new-one")
    other_disk = queue(acme, "on-b", disk_host=host_b)
    other_region = queue(acme, "far-away", in_region=RegionFactory(code="far-1", name="Far"))
    h100 = GpuModelFactory(code="h100-80gb", name="NVIDIA H100 80GB")
    other_model = queue(acme, "wants-h100", spec=SpecFactory(code="h100-q", gpu_model=h100))

    page = staff_client.get(f"/fleet/hosts/{host_a.pk}/").content.decode()

    assert f'href="{change("instance", holder.pk)}"' in page and "2g.20gb slices 4–5" in page
    assert "elsewhere" not in page
    card = page[page.index('data-testid="waiting"') :]
    assert "Waiting for this host" in card
    assert f'href="{change("instance", its_disk.pk)}"' in card and "(its disk)" in card
    assert f'href="{change("instance", any_host.pk)}"' in card
    for absent in (other_disk, other_region, other_model):
        assert absent.name not in card


def test_query_count_does_not_grow_with_hosts_holders_or_the_queue(
    register, hold, queue, staff_client, django_assert_max_num_queries
):
    host, _ = register("host-a", gpus=2, mode="shared")
    acme = TenantFactory(slug="acme")
    hold(host.gpus.get(index=0), acme, "one", milli=125)
    queue(acme, "wait-1", disk_host=host)

    def count(url: str) -> int:
        with CaptureQueriesContext(connection) as queries:
            assert staff_client.get(url).status_code == 200
        return len(queries)

    fleet, detail = count("/fleet/"), count(f"/fleet/hosts/{host.pk}/")
    for n in range(3):
        more, _ = register(f"host-more-{n}", gpus=2, mode="shared")
        tenant = TenantFactory(slug=f"t{n}")
        for index in range(2):
            hold(more.gpus.get(index=index), tenant, f"m{n}-{index}", milli=250)
            hold(host.gpus.get(index=index), tenant, f"h{n}-{index}", milli=125)
        queue(tenant, f"wait-more-{n}")
        queue(tenant, f"wait-disk-{n}", disk_host=host)
    with django_assert_max_num_queries(fleet):
        staff_client.get("/fleet/")
    with django_assert_max_num_queries(detail):
        staff_client.get(f"/fleet/hosts/{host.pk}/")
    assert count("/fleet/") == fleet and count(f"/fleet/hosts/{host.pk}/") == detail
