"""What an embedded console keeps on disk is its user's alone (issue 12, finding 13)."""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from console.fleet.models import Host
from tests.factories import RegionFactory

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import json, os, django
django.setup()
from django.db import connection
with connection.cursor() as cursor:
    cursor.execute("CREATE TABLE probe (x)")
    cursor.execute("INSERT INTO probe VALUES (1)")
var = os.environ["GPUCLOUD_VAR_DIR"]
print(json.dumps({name: os.stat(os.path.join(var, name)).st_mode for name in os.listdir(var)}
                 | {".": os.stat(var).st_mode}))
"""


def _mode(value: int) -> str:
    return oct(stat.S_IMODE(value))


@pytest.mark.integration
@pytest.mark.parametrize("existing", [False, True])
def test_var_and_the_sqlite_files_are_private(tmp_path, existing):
    var = tmp_path / "var"
    if existing:  # an install made before: world-readable var/, database and secrets
        var.mkdir(mode=0o755)
        (var / "gpucloud.sqlite3").touch(mode=0o644)
        for secret in ("secret-key", "snapshot-password"):
            (var / secret).write_text("made-before")
            (var / secret).chmod(0o644)
    env = {**os.environ, "GPUCLOUD_VAR_DIR": str(var), "DJANGO_SETTINGS_MODULE": "console.settings"}
    env.pop("DATABASE_URL", None)
    probe = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert probe.returncode == 0, probe.stderr
    modes = {name: _mode(mode) for name, mode in json.loads(probe.stdout).items()}
    assert modes["."] == "0o700"
    assert {
        "gpucloud.sqlite3",
        "gpucloud.sqlite3-wal",
        "secret-key",
        "snapshot-master-secret",
    } <= set(modes)
    files = {name: mode for name, mode in modes.items() if name not in (".", "static")}
    assert set(files.values()) == {"0o600"}


@pytest.mark.django_db
def test_host_secrets_are_not_stored_in_plain_text():
    host = Host(name="h1", region=RegionFactory(), address="http://h1.invalid:9101")
    host.set_secret("the-agents-own-secret")
    host.save()
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM fleet_host WHERE id = %s", [host.pk])
        row = cursor.fetchone()
    assert not any("the-agents-own-secret" in str(value) for value in row)
    assert Host.objects.get(pk=host.pk).secret == "the-agents-own-secret"
