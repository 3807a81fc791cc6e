"""The operator's install (issue 16): what the README's distributed section relies on."""

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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


def test_the_distributed_sections_commands_set_up_a_console_as_written(tmp_path):
    """Every `manage.py` line of the README's install, in its order (on SQLite here; the
    interactive ones told their answers): the catalog, the first operator, the first tenant
    and its owner, and a join token for the example's region."""
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
        "create_join_token",
    ]
    environ = {
        **{k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")},
        "GPUCLOUD_VAR_DIR": str(tmp_path / "var"),
        "DJANGO_SUPERUSER_PASSWORD": "a-long-operator-passphrase",
    }
    example = "console/catalog/examples/catalog.example.toml"
    outputs = {}
    for command in commands:
        command = [example if arg == "/etc/gpucloud/catalog.toml" else arg for arg in command]
        if command[1] == "createsuperuser":
            command.append("--noinput")
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
    assert "alice is owner of acme" in outputs["create_user"]
    assert "Password changed successfully for user 'alice'" in outputs["changepassword"]
    assert outputs["create_join_token"].strip().splitlines()[-1].startswith("gpj_")
