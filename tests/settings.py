"""The console's settings, for the suite (pytest's `--ds`).

Its state directory is made first, as every entry point does (console/state_dir.py), since
pytest-django reads the settings before any conftest.

Under pytest-xdist (`make test`) the workers share CI's Redis: each worker keeps to a database
number of its own (1, 2, … : below tests/backing.py's) under a deployment name of its own, since
every test empties its cache database (tests/conftest.py) and Redis pub/sub ignores database
numbers, while the workers' tests name the same tenants, groups and keys. The processes a test
starts inherit both and run the console's own settings.
"""

import os
from urllib.parse import urlsplit, urlunsplit

from console import state_dir

_worker = os.environ.get("PYTEST_XDIST_WORKER")
if _worker and os.environ.get("REDIS_URL"):
    _database = 1 + int(_worker.removeprefix("gw"))
    os.environ["REDIS_URL"] = urlunsplit(
        urlsplit(os.environ["REDIS_URL"])._replace(path=f"/{_database}")
    )
    os.environ.setdefault("DEPLOYMENT_NAME", f"gpucloud-test-{_worker}")

state_dir.prepare()

from console.settings import *  # noqa: E402, F403

os.environ["DJANGO_SETTINGS_MODULE"] = "console.settings"
