"""instances 0014 (a state reason's code and detail in two columns): every reason kept as one
line before it ("code: detail", "exit code 3", words) is split into its code and detail, and
reads as the same line after it."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from console.instances.models import Instance
from console.instances.reasons import Code, Reason

BEFORE = [("instances", "0013_event_continues_run_shelved")]
AFTER = [("instances", "0014_instance_state_reason_code")]
LINES = {
    "": Reason(),
    "oom_killed": Reason(Code.OOM_KILLED),
    "image_pull_failed: ghcr.io/x:1: manifest unknown": Reason(
        Code.IMAGE_PULL_FAILED, "ghcr.io/x:1: manifest unknown"
    ),
    "exit code 3": Reason(Code.EXIT_CODE, "3"),
    "budget_stopped: monthly budget of 0.12 USD reached at 0.13 USD": Reason(
        Code.BUDGET_STOPPED, "monthly budget of 0.12 USD reached at 0.13 USD"
    ),
    "Waiting for capacity: no A100 x1 free in Local 1.": Reason(
        detail="Waiting for capacity: no A100 x1 free in Local 1."
    ),
    "pulling ghcr.io/x:1: 2 of 5 layers": Reason(detail="pulling ghcr.io/x:1: 2 of 5 layers"),
    "retired_code: what it said": Reason(detail="retired_code: what it said"),
}


@pytest.mark.slow  # migrating back and forth takes seconds
@pytest.mark.django_db(transaction=True)
def test_the_reasons_kept_before_are_split_into_code_and_detail(catalog, tenant):
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps.get_model("instances", "Instance")
    for n, line in enumerate(LINES):
        old.objects.create(
            tenant_id=tenant.pk, name=f"box-{n}", spec_id=catalog.quarter.pk,
            image_id=catalog.image.pk, region_id=catalog.region.pk, state_reason=line,
        )  # fmt: skip
    executor = MigrationExecutor(connection)
    executor.migrate(AFTER)
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    kept = {i.name: i for i in Instance.objects.all()}
    for n, (line, reason) in enumerate(LINES.items()):
        instance = kept[f"box-{n}"]
        assert (instance.reason, instance.state_reason) == (reason, line)

    # and back: the one line again
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps.get_model("instances", "Instance")
    assert sorted(old.objects.values_list("state_reason", flat=True)) == sorted(LINES)
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
