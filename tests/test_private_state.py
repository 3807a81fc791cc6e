"""What an embedded console keeps on disk is its user's alone (issue 12, finding 13)."""

import json
import os
import runpy
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from console import state_dir
from console.fleet.models import Host
from tests.factories import RegionFactory

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import json, os, django
from console import state_dir
state_dir.prepare()
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


def test_reading_the_settings_makes_nothing_on_disk(tmp_path, monkeypatch):
    """The settings compute where the state lies; the entry points make it
    (console.state_dir.prepare)."""
    var = tmp_path / "var"
    monkeypatch.setenv("GPUCLOUD_VAR_DIR", str(var))
    for name in ("DATABASE_URL", "GPUCLOUD_SQLITE_PATH", "SECRET_KEY", "SNAPSHOT_MASTER_SECRET"):
        monkeypatch.delenv(name, raising=False)
    settings = runpy.run_path(str(ROOT / "console" / "settings.py"))
    assert settings["VAR_DIR"] == var
    assert settings["SECRET_KEY"] == "" and settings["SNAPSHOT_MASTER_SECRET"] == ""
    assert list(tmp_path.iterdir()) == []


def test_the_settings_read_what_prepare_made(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUCLOUD_VAR_DIR", str(tmp_path))
    for name in ("DATABASE_URL", "GPUCLOUD_SQLITE_PATH", "SECRET_KEY", "SNAPSHOT_MASTER_SECRET"):
        monkeypatch.delenv(name, raising=False)
    state_dir.prepare()
    settings = runpy.run_path(str(ROOT / "console" / "settings.py"))
    assert settings["SECRET_KEY"] == (tmp_path / "secret-key").read_text()
    assert settings["SNAPSHOT_MASTER_SECRET"] == (tmp_path / "snapshot-master-secret").read_text()
    assert settings["DATABASES"]["default"]["NAME"] == str(tmp_path / "gpucloud.sqlite3")


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
