"""Reconcile's log line names what its repair did, and says nothing at INFO when there was
nothing to mend (issue 33, item 13)."""

import logging
from datetime import timedelta

import pytest
from django.utils import timezone

from console.catalog.models import Mode
from console.instances import services, tasks
from console.instances.models import Instance
from tests.instances.test_tasks import agents, eager  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db


@pytest.mark.usefixtures("agents", "eager")
def test_the_line_names_the_redriven_launches_and_is_silent_otherwise(
    catalog, tenant, settings, caplog, django_capture_on_commit_callbacks
):
    host = catalog.host(gpus=1, mode=Mode.SHARED)
    launched = []
    for name in ("a", "b"):
        with django_capture_on_commit_callbacks(execute=False):  # its provision task is lost
            launched.append(
                services.launch_instance(
                    tenant, name=name, spec=catalog.quarter, image=catalog.image
                ).pk
            )
    placed = timezone.now() - timedelta(seconds=settings.LAUNCH_REDRIVE_SECONDS + 1)
    Instance.objects.filter(pk__in=launched).update(updated_at=placed)
    caplog.set_level(logging.INFO, logger="console.instances.tasks")
    with django_capture_on_commit_callbacks(execute=True):
        tasks.reconcile_host.apply(args=[host.pk])
    ids = ", ".join(str(pk) for pk in sorted(launched))
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("reconcile host")]
    assert said == [f"reconcile host {host.name}: redriven 2 launches (instances {ids})"]
    assert "'removed'" not in caplog.text

    caplog.clear()
    tasks.reconcile_host.apply(args=[host.pk])
    assert not [r for r in caplog.records if r.levelno >= logging.INFO]
