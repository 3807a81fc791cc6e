"""The operator's install (issue 16): what the README's distributed section relies on."""

import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.integration  # each test runs manage.py, celery or psql


def test_beat_keeps_its_schedule_under_the_var_dir_not_where_it_was_started(tmp_path):
    var, elsewhere = tmp_path / "var", tmp_path / "cwd"
    elsewhere.mkdir()
    environ = {**os.environ, "GPUCLOUD_VAR_DIR": str(var), "PYTHONPATH": str(ROOT)}
    for name in ("DATABASE_URL", "REDIS_URL"):
        environ.pop(name, None)
    beat = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "console", "beat", "-l", "INFO"],
        cwd=elsewhere,
        env=environ,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not list(var.glob("celerybeat-schedule*")) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        beat.send_signal(signal.SIGTERM)
        beat.wait(20)
    assert list(var.glob("celerybeat-schedule*"))
    assert not list(elsewhere.iterdir())


@pytest.mark.timeout(300)
def test_the_distributed_sections_commands_set_up_a_console_as_written(tmp_path):
    """Every `manage.py` line of the README's install, in its order (on SQLite here; the
    interactive one told its answers): the catalog, the first operator (from the block's
    `export DJANGO_SUPERUSER_…` lines, without a terminal), the first tenant and its owner, and
    a join token for the example's region."""
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("# 0. The environment") :].split("```")[0]
    commands = [
        shlex.split(line.split("   #")[0])[1:]
        for line in block.splitlines()
        if line.startswith(".venv/bin/python manage.py")
    ]
    assert [command[1] for command in commands] == [
        "migrate",
        "apply_catalog",
        "createsuperuser",
        "create_tenant",
        "create_user",
        "changepassword",
        "collectstatic",
        "ssh_front",
        "create_join_token",
    ]
    commands = [c for c in commands if c[1] != "ssh_front"]  # a server, as uvicorn's and Celery's
    operator = dict(
        assignment.split("=", 1)
        for line in block.splitlines()
        if line.startswith("export DJANGO_SUPERUSER_")
        for assignment in shlex.split(line.split("#")[0])[1:]
    )
    assert set(operator) == {f"DJANGO_SUPERUSER_{k}" for k in ("USERNAME", "EMAIL", "PASSWORD")}
    environ = {
        **{k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")},
        **operator,
        "GPUCLOUD_VAR_DIR": str(tmp_path / "var"),
        "DJANGO_SUPERUSER_PASSWORD": "a-long-operator-passphrase",  # the README's is `…`
    }
    example = "console/catalog/examples/catalog.example.toml"
    outputs = {}
    for command in commands:
        command = [example if arg == "/etc/gpucloud/catalog.toml" else arg for arg in command]
        if command[1] == "changepassword":  # interactive: the password is typed twice
            done = subprocess.run(
                [sys.executable, *command],
                cwd=ROOT,
                env=environ,
                input="a-long-owner-passphrase\na-long-owner-passphrase\n",
                start_new_session=True,  # no terminal: getpass reads the answers from stdin
                capture_output=True,
                text=True,
            )
        else:
            done = subprocess.run(
                [sys.executable, *command], cwd=ROOT, env=environ, capture_output=True, text=True
            )
        assert done.returncode == 0, (command, done.stderr)
        outputs[command[1]] = done.stdout
    assert "+ region local-1" in outputs["apply_catalog"]
    assert "Superuser created successfully" in outputs["createsuperuser"]
    assert "alice is owner of acme" in outputs["create_user"]
    assert "Password changed successfully for user 'alice'" in outputs["changepassword"]
    assert outputs["create_join_token"].strip().splitlines()[-1].startswith("gpj_")


@pytest.mark.timeout(300)
def test_the_readmes_database_role_and_url_serve_the_console(tmp_path):
    """The README's PostgreSQL step as written (its `psql -c` statements, run as the server's
    superuser), under names of the test's own and a password that the URL must percent-encode:
    the console migrates its database as that role."""
    import psycopg

    server = os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/test"
    if not server.startswith("postgres"):
        pytest.skip("no PostgreSQL: set DATABASE_URL")
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("sudo -u postgres psql") :].split("```")[0]
    statements = re.findall(r'-c "([^"]+)"', block)
    assert [s.split()[:2] for s in statements] == [["CREATE", "ROLE"], ["CREATE", "DATABASE"]]
    name, password = f"gpucloud_{secrets.token_hex(6)}", f"p@ss:w/rd#%?{secrets.token_hex(4)}"
    ours = [
        re.sub(r"\bgpucloud\b", name, s).replace("'the-db-password'", f"'{password}'")
        for s in statements
    ]
    steps = readme[readme.index("# 0. The environment") :].split("```")[0]
    written = urlsplit(re.search(r"DATABASE_URL=(\S+)", steps).group(1))
    written_as = (written.username, written.password, written.path)
    assert written_as == ("gpucloud", "the-db-password", "/gpucloud")
    here = urlsplit(server)
    address = f"{here.hostname}:{here.port or 5432}"
    url = f"{written.scheme}://{name}:{quote(password, safe='')}@{address}/{name}"
    psql = ["psql", server, "-v", "ON_ERROR_STOP=1", *(a for s in ours for a in ("-c", s))]
    try:
        done = subprocess.run(psql, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        environ = {
            **{k: v for k, v in os.environ.items() if k != "REDIS_URL"},
            "DATABASE_URL": url,
            "GPUCLOUD_VAR_DIR": str(tmp_path / "var"),
        }
        migrate = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput"],
            cwd=ROOT, env=environ, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        assert migrate.returncode == 0, migrate.stderr
        with psycopg.connect(url) as conn:
            tables = conn.execute("SELECT tableowner FROM pg_tables WHERE schemaname = 'public'")
            assert {owner for (owner,) in tables} == {name}
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'DROP ROLE IF EXISTS "{name}"')
