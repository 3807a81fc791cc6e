"""The operator's install (issue 16): what the README's distributed section relies on."""

import os
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
