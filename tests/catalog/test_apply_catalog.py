"""`manage.py apply_catalog FILE`: the operator's declarative catalog."""

import tomllib
from datetime import UTC, datetime
from decimal import Decimal
from io import StringIO
from pathlib import Path

import pytest
import time_machine
from django.core.management import call_command
from django.core.management.base import CommandError
from hypothesis import given, settings
from hypothesis import strategies as st

from accounts.models import Tenant
from console.catalog import apply as catalog
from console.catalog.models import GpuModel, Image, MigProfile, Region, Spec
from console.fleet.models import Host
from console.instances.models import Instance, State
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db

EXAMPLE = Path(__file__).parents[2] / "console/catalog/examples/catalog.example.toml"
NOW = datetime(2026, 12, 10, 12, 0, tzinfo=UTC)

SMALL = """
[[regions]]
code = "eu-1"
name = "EU 1"

[[gpu_models]]
code = "a100-80gb"
name = "NVIDIA A100 80GB"
memory_mib = 81920
mig_profiles = [
  { name = "1g.10gb", compute_slices = 1, size = 1, starts = [0, 1, 2, 3], memory_mib = 9984 },
  { name = "3g.40gb", compute_slices = 3, size = 4, starts = [0, 4], memory_mib = 40192 },
]

[[specs]]
code = "a100-x1"
name = "1× A100"
gpu_model = "a100-80gb"
mode = "whole"
gpu_memory_mib = 81920
vcpus = 12
ram_mib = 131072
disk_gib = 500
prices = [{ from = 2026-01-01, per_hour = "1.89" }]

[[specs]]
code = "a100-1g"
name = "A100 MIG 1g.10gb"
gpu_model = "a100-80gb"
mode = "mig"
mig_profile = "1g.10gb"
gpu_memory_mib = 9984
vcpus = 2
ram_mib = 16384
disk_gib = 100
prices = [{ from = 2026-01-01, per_hour = "0.29" }]

[[images]]
name = "busybox"
reference = "localhost/gpucloud/demo:latest"
cuda_version = "12.4"
ports = [{ port = 8888, name = "Jupyter" }]
"""


def apply(tmp_path, text: str, *args) -> str:
    path = tmp_path / "catalog.toml"
    path.write_text(text)
    out = StringIO()
    call_command("apply_catalog", str(path), *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def refused(tmp_path, text: str) -> str:
    path = tmp_path / "catalog.toml"
    path.write_text(text)
    err = StringIO()
    with pytest.raises(CommandError, match="nothing changed"):
        call_command("apply_catalog", str(path), stdout=StringIO(), stderr=err)
    return err.getvalue()


def launch(spec_code: str, state=State.RUNNING) -> Instance:
    tenant = Tenant.objects.first() or TenantFactory(slug="acme")
    return Instance.objects.create(
        tenant=tenant,
        name=f"job-{Instance.objects.count()}",
        spec=Spec.objects.get(code=spec_code),
        image=Image.objects.get(name="busybox"),
        region=Region.objects.get(code="eu-1"),
        state=state,
    )


@time_machine.travel(NOW, tick=False)
def test_the_shipped_example_applies_then_changes_nothing(tmp_path):
    out = apply(tmp_path, EXAMPLE.read_text())
    names = {code for code, _ in tomllib.loads(EXAMPLE.read_text()).items()}
    assert names == {"regions", "gpu_models", "specs", "images"}
    assert set(GpuModel.objects.values_list("code", flat=True)) == {
        "a100-80gb",
        "h100-80gb",
        "h200-141gb",
        "l4",
    }
    assert MigProfile.objects.filter(gpu_model__code="a100-80gb").count() == 6
    assert not GpuModel.objects.get(code="l4").mig_capable
    assert set(Spec.objects.values_list("mode", flat=True)) == {"whole", "mig", "shared"}
    assert Spec.objects.get(code="a100-quarter").price_per_hour == Decimal("0.49")
    assert Image.objects.get(name="demo-busybox").ports == [{"port": 8888, "name": "Web page"}]
    jupyter = Image.objects.get(name="jupyterlab").ports
    assert jupyter == [{"port": 8888, "name": "JupyterLab", "app": "jupyter"}]
    assert "+ spec a100-quarter at 0.4900/h from 2026-01-01 00:00 UTC" in out
    assert "+ region local-1" in out

    assert apply(tmp_path, EXAMPLE.read_text()).strip() == "No changes."


@time_machine.travel(NOW, tick=False)
def test_a_change_is_shown_and_made(tmp_path):
    apply(tmp_path, SMALL)
    changed = SMALL.replace("vcpus = 12", "vcpus = 16").replace('name = "EU 1"', 'name = "EU one"')
    changed = changed.replace(
        'per_hour = "1.89" }]', 'per_hour = "1.89" }, { from = 2027-01-01, per_hour = "1.79" }]'
    )
    out = apply(tmp_path, changed)
    assert "~ region eu-1: name 'EU 1' → 'EU one'" in out
    assert "~ spec a100-x1: vcpus 12 → 16" in out
    assert "+ price of spec a100-x1: 1.79/h from 2027-01-01 00:00 UTC" in out
    spec = Spec.objects.get(code="a100-x1")
    assert spec.vcpus == 16
    assert spec.price_per_hour == Decimal("1.89")
    assert spec.next_price_change().price_per_hour == Decimal("1.79")
    assert apply(tmp_path, changed).strip() == "No changes."
    # Taking the scheduled point out of the file cancels it; the first one stays.
    out = apply(tmp_path, SMALL.replace("vcpus = 12", "vcpus = 16").replace("EU 1", "EU one"))
    assert (
        "- price of spec a100-x1: 1.7900/h from 2027-01-01 00:00 UTC (scheduled, cancelled)" in out
    )
    assert spec.next_price_change() is None


@time_machine.travel(NOW, tick=False)
def test_dry_run_says_what_would_change_and_changes_nothing(tmp_path):
    out = apply(tmp_path, SMALL, "--dry-run")
    assert "+ spec a100-x1 at 1.89/h from 2026-01-01 00:00 UTC" in out
    assert "would be made (dry run)" in out
    assert not Spec.objects.exists() and not Region.objects.exists()


@time_machine.travel(NOW, tick=False)
def test_removing_what_live_instances_use_is_refused_and_names_them(tmp_path):
    apply(tmp_path, SMALL)
    launch("a100-x1")
    without_spec = SMALL.replace('code = "a100-x1"', 'code = "a100-x1-new"')
    err = refused(tmp_path, without_spec)
    assert "cannot remove spec a100-x1: instances still use it (job-0 (running))." in err
    # Nothing of the file was applied either.
    assert not Spec.objects.filter(code="a100-x1-new").exists()
    # Its shape does not change under them either; its name may.
    err = refused(tmp_path, SMALL.replace("disk_gib = 500", "disk_gib = 600"))
    assert "cannot change disk_gib while instances use it (job-0 (running))" in err
    assert "~ spec a100-x1: name" in apply(tmp_path, SMALL.replace('"1× A100"', '"One A100"'))


@time_machine.travel(NOW, tick=False)
def test_a_spec_only_history_uses_is_retired_and_one_nothing_uses_deleted(tmp_path):
    apply(tmp_path, SMALL)
    launch("a100-x1", state=State.TERMINATED)
    without_specs = SMALL.split("[[specs]]")[0] + "[[images]]" + SMALL.split("[[images]]")[1]
    out = apply(tmp_path, without_specs)
    assert "~ spec a100-x1: retired (kept: terminated instances or billed usage)" in out
    assert "- spec a100-1g" in out
    assert not Spec.objects.get(code="a100-x1").active
    assert not Spec.objects.filter(code="a100-1g").exists()
    assert apply(tmp_path, without_specs).strip() == "No changes."


@time_machine.travel(NOW, tick=False)
def test_removing_a_region_with_hosts_or_a_profile_a_kept_spec_uses_is_refused(tmp_path):
    apply(tmp_path, SMALL)
    region = Region.objects.get(code="eu-1")
    Host.objects.create(name="gpu-host-1", region=region, address="http://gpu-host-1:9101")
    err = refused(tmp_path, SMALL.replace('"eu-1"\nname = "EU 1"', '"eu-2"\nname = "EU 2"'))
    assert "cannot remove region eu-1: still used by 1 host (gpu-host-1)." in err
    assert not Region.objects.filter(code="eu-2").exists()

    # The MIG spec is retired (a terminated instance used it), so its profile stays.
    launch("a100-1g", state=State.TERMINATED)
    only_whole = (
        SMALL[: SMALL.index("[[specs]]", SMALL.index("a100-x1"))]
        + SMALL[SMALL.index("[[images]]") :]
    )
    without_profile = only_whole.replace('  { name = "1g.10gb"', '  # { name = "1g.10gb"')
    err = refused(tmp_path, without_profile)
    assert "cannot remove MIG profile a100-80gb 1g.10gb: still used by 1 spec" in err
    assert "~ spec a100-1g: retired" in apply(tmp_path, only_whole)


@time_machine.travel(NOW, tick=False)
def test_a_price_point_is_never_edited_and_none_lands_in_a_closed_month(tmp_path):
    apply(tmp_path, SMALL)
    err = refused(tmp_path, SMALL.replace('per_hour = "1.89"', 'per_hour = "1.99"'))
    assert "a price point is never edited: add a new one" in err
    late = SMALL.replace(
        'per_hour = "1.89" }]', 'per_hour = "1.89" }, { from = 2026-11-15, per_hour = "1.79" }]'
    )
    err = refused(tmp_path, late)
    assert "takes effect in the open month (from 2026-12-01 UTC) or later" in err


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[[regions]\ncode =", "not valid TOML"),
        ("[[regions]]\ncode = \"x\"\n", "regions[0] (x): missing name."),
        ("[[regions]]\ncode = \"x\"\nname = \"X\"\nzone = 1\n", "unknown key zone."),
        ("[[hosts]]\nname = \"h\"\n", "unknown section hosts"),
        (SMALL.replace('mode = "whole"', 'mode = "half"'), "mode must be one of whole, mig"),
        (SMALL.replace("vcpus = 12", 'vcpus = "many"'), "vcpus: a whole number, not 'many'."),
        (SMALL.replace('"a100-80gb"\nmode = "whole"', '"b200"\nmode = "whole"'),
         "gpu_model 'b200' is not in gpu_models."),
        (SMALL.replace('per_hour = "1.89"', 'per_hour = "cheap"'), "'cheap' is not a price"),
        (SMALL.replace('per_hour = "1.89"', 'per_hour = "-1"'), "is not a price of at most 4"),
        (SMALL.replace("prices = [{ from = 2026-01-01, per_hour = \"1.89\" }]", ""),
         "prices: at least one"),
        (SMALL.replace("starts = [0, 4]", "starts = [0, 6]"), "Starts must be slice numbers"),
        (SMALL.replace("port = 8888", "port = 70000"), "a port is a number from 1 to 65535"),
        (SMALL + SMALL.split("[[images]]")[1].join(["[[images]]", ""]),
         "image 'busybox' is listed twice"),
    ],
)  # fmt: skip
def test_a_bad_file_is_refused_with_one_line_per_problem_and_changes_nothing(
    tmp_path, text, problem
):
    err = refused(tmp_path, text)
    assert problem in err
    assert "Traceback" not in err
    assert not Region.objects.exists()


def test_a_missing_file_is_a_one_line_error(tmp_path):
    err = StringIO()
    with pytest.raises(CommandError):
        call_command("apply_catalog", str(tmp_path / "none.toml"), stderr=err)
    assert "cannot read it (No such file or directory)" in err.getvalue()


def _snapshot() -> dict:
    return {
        "regions": sorted(Region.objects.values_list("code", "name")),
        "models": sorted(GpuModel.objects.values_list("code", "name", "memory_mib", "mig_capable")),
        "profiles": sorted(
            MigProfile.objects.values_list("gpu_model__code", "name", "size", "memory_mib")
        ),
        "specs": sorted(
            Spec.objects.values_list(
                "code",
                "gpu_model__code",
                "mode",
                "gpu_count",
                "mig_profile__name",
                "milli",
                "gpu_memory_mib",
                "vcpus",
                "ram_mib",
                "disk_gib",
                "active",
            )
        ),  # fmt: skip
        "prices": sorted(
            Spec.objects.values_list("code", "prices__effective_from", "prices__price_per_hour")
        ),
        "images": sorted(Image.objects.values_list("name", "reference", "active")),
    }


def _subset(document: dict, specs: set[str], images: set[str]) -> dict:
    """The example with only some specs and images (and the GPU models those specs use)."""
    kept_specs = [s for s in document["specs"] if s["code"] in specs]
    models = {s["gpu_model"] for s in kept_specs}
    return {
        "regions": document["regions"],
        "gpu_models": [m for m in document["gpu_models"] if m["code"] in models],
        "specs": kept_specs,
        "images": [i for i in document["images"] if i["name"] in images],
    }


EXAMPLE_DOC = tomllib.loads(EXAMPLE.read_text())
SPEC_CODES = sorted(s["code"] for s in EXAMPLE_DOC["specs"])
IMAGE_NAMES = sorted(i["name"] for i in EXAMPLE_DOC["images"])
subsets = st.tuples(st.sets(st.sampled_from(SPEC_CODES)), st.sets(st.sampled_from(IMAGE_NAMES)))


@pytest.mark.slow
@settings(max_examples=10, deadline=None)
@given(first=subsets, second=subsets)
def test_the_catalog_ends_as_the_last_file_says_whatever_came_before(first, second):
    """Applying A then B leaves what applying B alone leaves (nothing in use), and B again
    changes nothing."""
    for model in (Spec, Image, GpuModel, Region):
        model.objects.all().delete()
    catalog.apply(_subset(EXAMPLE_DOC, *first))
    catalog.apply(_subset(EXAMPLE_DOC, *second))
    after_both = _snapshot()
    assert catalog.apply(_subset(EXAMPLE_DOC, *second)).changes == []
    for model in (Spec, Image, GpuModel, Region):
        model.objects.all().delete()
    catalog.apply(_subset(EXAMPLE_DOC, *second))
    assert _snapshot() == after_both
