"""Outside the tests and `make run`, a process without REDIS_URL refuses to queue a task to its
in-memory broker, which no worker reads, and says to set REDIS_URL (issue 33, item 7)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from console.catalog.models import Mode
from console.instances import services
from console.instances.models import Instance

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.django_db
def test_a_launch_is_refused_and_rolled_back_without_a_broker(catalog, tenant, settings):
    settings.ALLOW_IN_MEMORY_BROKER = False
    settings.CELERY_BROKER_URL = "memory://"  # as without REDIS_URL (CI sets one)
    catalog.host(gpus=1, mode=Mode.SHARED)
    with pytest.raises(ImproperlyConfigured, match="REDIS_URL is not set.*provision"):
        services.launch_instance(tenant, name="box", spec=catalog.quarter, image=catalog.image)
    assert not Instance.objects.exists()  # no instance left `provisioning` with no task


@pytest.mark.integration
def test_manage_py_shell_without_redis_url_refuses_to_queue(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "ALLOW_IN_MEMORY_BROKER")}
    env["GPUCLOUD_VAR_DIR"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c",
         "from console.instances import queue; queue.kick_scheduler()"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    assert "REDIS_URL is not set" in done.stderr
    assert "console.instances.tasks.schedule_pending would never reach a worker" in done.stderr
