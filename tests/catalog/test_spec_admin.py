"""The admin's spec form: field-level errors, and a new or changed spec checked against the
hosts of each region that would run it (GPU model, mode, MIG profile, GPU count, vCPUs and
RAM, and vCPUs/RAM per GPU): a warning, never a refusal. A MIG profile's start slices are
boxes to tick, not JSON."""

import html
import re

import pytest

from console.catalog.models import MigProfile, Spec
from console.fleet import services
from tests.catalog.test_image_admin import admin_client, errors_of  # noqa: F401 (a fixture)
from tests.factories import A100_PROFILES, GpuModelFactory, RegionFactory, mig_profile
from tests.fleet.conftest import make_gpu, with_digest

pytestmark = pytest.mark.django_db

ADD = "/admin/catalog/spec/add/"


@pytest.fixture
def a100():
    return GpuModelFactory()


@pytest.fixture
def register(a100):
    """Register a host of `region` (Local 1) as its agent would."""

    def do(hostname, gpus=4, mode="whole", vcpus=64, ram_mib=512 * 1024, region=None):
        region = region or RegionFactory(code="local-1", name="Local 1")
        _, raw = services.create_join_token(region)
        inventory = {
            "hostname": hostname,
            "agent_version": "0.1.0",
            "backend": "sim",
            "runtime": "sim",
            "cpu_count": vcpus,
            "memory_mib": ram_mib,
            "gpus": [make_gpu(i, hostname, mode=mode) for i in range(gpus)],
        }
        host, _ = services.register_host(
            join_token=raw,
            hostname=hostname,
            address="http://127.0.0.1:9101",
            remote_addr="127.0.0.1",
            region_code=region.code,
            agent_version="0.1.0",
            inventory=with_digest(inventory),
        )
        return host

    return do


def spec(a100, **fields) -> dict:
    data = {
        "code": "a100-quarter",
        "name": "A100 quarter",
        "gpu_model": str(a100.pk),
        "mode": "shared",
        "gpu_count": "1",
        "mig_profile": "",
        "milli": "250",
        "gpu_memory_mib": "20480",
        "vcpus": "4",
        "ram_mib": "32768",
        "disk_gib": "100",
        "active": "on",
        "price_per_hour": "0.90",
        "prices-TOTAL_FORMS": "0",
        "prices-INITIAL_FORMS": "0",
        "prices-MIN_NUM_FORMS": "0",
        "prices-MAX_NUM_FORMS": "1000",
    }
    data.update(fields)
    return data


def warnings(page: str) -> list[str]:
    return [
        html.unescape(re.sub(r"<[^>]+>", "", m)).strip()
        for m in re.findall(r'<li class="warning">(.*?)</li>', page, re.S)
    ]


def test_a_spec_the_hosts_hold_saves_without_a_warning(admin_client, register, a100):  # noqa: F811
    register("host-a", mode="shared")
    page = admin_client.post(ADD, spec(a100), follow=True).content.decode()
    assert "was added successfully" in page and warnings(page) == []
    saved = Spec.objects.get(code="a100-quarter")
    change = admin_client.get(f"/admin/catalog/spec/{saved.pk}/change/").content.decode()
    assert "Hosts that can hold it" in change and "Local 1: host-a." in change


def test_too_little_ram_or_vcpus_is_named_with_the_host(admin_client, register, a100):  # noqa: F811
    register("host-b", gpus=8, vcpus=128, ram_mib=1024 * 1024)
    data = spec(
        a100, code="h8", mode="whole", gpu_count="8", milli="", vcpus="192", ram_mib="1572864"
    )
    page = admin_client.post(ADD, data, follow=True).content.decode()
    assert Spec.objects.filter(code="h8").exists()  # a warning, not a refusal
    assert warnings(page) == [
        "A100 quarter: No host can hold it, so no tenant can launch it. Local 1: h8 asks 192 "
        "vCPUs and 1.5 TiB of RAM; host-b has only 128 vCPUs and 1 TiB of RAM."
    ]


def test_a_mode_or_mig_profile_no_host_offers_is_warned_of(admin_client, register, a100):  # noqa: F811
    register("host-a", mode="whole")
    profile = mig_profile(a100, "3g.40gb")
    data = spec(a100, code="mig3", mode="mig", mig_profile=str(profile.pk), milli="")
    page = admin_client.post(ADD, data, follow=True).content.decode()
    assert Spec.objects.filter(code="mig3").exists()
    assert (
        "Local 1: no host has NVIDIA A100 80GB GPUs in MIG mode with room for a 3g.40gb "
        "instance." in warnings(page)[0]
    )
    # Once a host has MIG GPUs, the same spec is fine.
    register("host-m", mode="mig")
    again = admin_client.post(
        f"/admin/catalog/spec/{Spec.objects.get(code='mig3').pk}/change/",
        {**data, "name": "MIG 3g"},
        follow=True,
    ).content.decode()
    assert warnings(again) == []


def test_a_spec_asking_more_vcpus_per_gpu_than_a_host_has(admin_client, register, a100):  # noqa: F811
    register("host-a", gpus=4, mode="shared", vcpus=64)
    page = admin_client.post(ADD, spec(a100, vcpus="32"), follow=True).content.decode()
    assert warnings(page) == [
        "A100 quarter: host-a's 64 vCPUs hold 2 instances of a100-quarter, its GPUs 16: it asks "
        "more per GPU than the host has, and the rest of its GPUs stay idle."
    ]


def test_a_region_without_the_gpu_model_is_no_warning_when_another_holds_it(
    admin_client,  # noqa: F811
    register,
    a100,
):
    register("host-a", mode="shared")
    register("host-x", region=RegionFactory(code="edge", name="Edge"), gpus=0)
    page = admin_client.post(ADD, spec(a100), follow=True).content.decode()
    assert warnings(page) == []
    saved = Spec.objects.get(code="a100-quarter")
    change = admin_client.get(f"/admin/catalog/spec/{saved.pk}/change/").content.decode()
    assert "Edge: no host has NVIDIA A100 80GB GPUs in shared mode" in change


def test_with_no_host_at_all_it_says_so(admin_client, a100):  # noqa: F811
    page = admin_client.post(ADD, spec(a100), follow=True).content.decode()
    assert warnings(page) == [
        "A100 quarter: No host is registered yet: no tenant can launch it until one is."
    ]


def test_bad_input_is_named_at_its_field(admin_client, a100):  # noqa: F811
    response = admin_client.post(ADD, spec(a100, mode="mig", milli="", vcpus="many"))
    assert response.status_code == 200
    assert not Spec.objects.exists()
    assert errors_of(response, "vcpus") == ["Enter a whole number."]
    fixed = admin_client.post(ADD, spec(a100, mode="mig", milli=""))
    assert errors_of(fixed, "mig_profile") == ["A MIG spec needs a MIG profile."]
    shared = admin_client.post(ADD, spec(a100, milli="1500"))
    assert errors_of(shared, "milli") == ["A shared spec takes between 1 and 999 milli-GPU."]


def profile_rows(a100, starts: list[str], size="4") -> dict:
    data = {
        "code": a100.code,
        "name": a100.name,
        "memory_mib": str(a100.memory_mib),
        "mig_capable": "on",
        "mig_profiles-TOTAL_FORMS": "1",
        "mig_profiles-INITIAL_FORMS": "0",
        "mig_profiles-MIN_NUM_FORMS": "0",
        "mig_profiles-MAX_NUM_FORMS": "1000",
        "mig_profiles-0-name": "3g.40gb",
        "mig_profiles-0-compute_slices": "3",
        "mig_profiles-0-size": size,
        "mig_profiles-0-memory_mib": "40192",
        "mig_profiles-0-gpu_model": str(a100.pk),
    }
    return {**data, "mig_profiles-0-starts": starts}


def test_mig_start_slices_are_ticked_boxes(admin_client, a100):  # noqa: F811
    url = f"/admin/catalog/gpumodel/{a100.pk}/change/"
    response = admin_client.post(url, profile_rows(a100, ["0", "4"]))
    assert response.status_code == 302, response.content.decode()[:3000]
    profile = MigProfile.objects.get(gpu_model=a100, name="3g.40gb")
    assert profile.starts == [0, 4]
    page = admin_client.get(url).content.decode()
    assert 'type="checkbox" name="mig_profiles-0-starts" value="4"' in page
    assert "[0, 4]" not in page
    assert len(A100_PROFILES) == 6


def test_a_start_that_does_not_fit_is_refused_at_its_field(admin_client, a100):  # noqa: F811
    url = f"/admin/catalog/gpumodel/{a100.pk}/change/"
    response = admin_client.post(url, profile_rows(a100, ["6"]))
    assert response.status_code == 200
    assert "Starts must be slice numbers that fit in 8 slices." in response.content.decode()
    assert not MigProfile.objects.exists()
    none = admin_client.post(url, profile_rows(a100, []))
    assert "This field is required." in none.content.decode()
