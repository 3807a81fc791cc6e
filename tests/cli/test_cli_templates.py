"""`gpucloud launch --template` end to end, as a user runs it (a process of its own), against
the real stack (ASGI server, Celery worker) and a real simulated agent: save an instance as a
template, launch it with a field overridden and a generated name, and never print a secret."""

import json
import os
import subprocess
import sys

import pytest

from accounts import services as accounts
from console import secret_env
from console.instances.models import Instance
from tests.instances.e2e import make_catalog, make_tenant, start_agent

pytestmark = [pytest.mark.integration]
TOKEN = "hf_cliSecretValue42"


@pytest.fixture
def gpucloud(stack, tmp_path):
    make_catalog()
    _, membership = make_tenant()
    start_agent(stack, "gpu-1", gpus=2)
    home = tmp_path / "home"
    home.mkdir()
    env = {
        **os.environ,
        "HOME": str(home),
        "GPUCLOUD_URL": stack.url,
        "GPUCLOUD_TOKEN": accounts.issue_token(membership.user, membership.tenant, "cli").raw,
        "GPUCLOUD_CONFIG": str(home / ".config" / "gpucloud" / "config.json"),
        "HF_TOKEN": TOKEN,  # --secret HF_TOKEN reads it from here
    }

    def run(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [sys.executable, "-m", "cli.main", *args],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert TOKEN not in done.stdout + done.stderr
        return done

    return run


def test_save_then_launch_a_template_with_overrides(gpucloud):
    base = gpucloud("launch", "base", "--spec", "a100-quarter", "--env", "SEED=7",
                    "--secret", "HF_TOKEN", "--secret", "DB_PASSWORD=pw", "--wait")  # fmt: skip
    assert base.returncode == 0, base.stderr
    saved = gpucloud("templates", "save", "base", "trainer")
    assert saved.returncode == 0, saved.stderr
    listed = gpucloud("templates", "list")
    assert "trainer" in listed.stdout and "a100-quarter" in listed.stdout

    launched = gpucloud("--json", "launch", "--template", "trainer", "--env", "EPOCHS=3",
                        "--spec", "a100-half", "--wait")  # fmt: skip
    assert launched.returncode == 0, launched.stderr
    name = Instance.objects.exclude(name="base").get().name
    assert name.startswith("a100-half-")  # generated from the overridden spec
    instance = Instance.objects.get(name=name)
    assert instance.env == {"SEED": "7", "EPOCHS": "3"} and instance.spec.code == "a100-half"
    assert secret_env.open_all(instance.secret_env) == {"HF_TOKEN": TOKEN, "DB_PASSWORD": "pw"}
    masked = {"HF_TOKEN": secret_env.MASK, "DB_PASSWORD": secret_env.MASK}
    assert json.loads(launched.stdout)["secret_env"] == masked
    assert gpucloud("--json", "show", name).returncode == 0

    assert gpucloud("templates", "delete", "trainer").returncode == 0
    assert "trainer" not in gpucloud("templates", "list").stdout


def test_a_template_that_is_not_there_and_a_launch_of_nothing(gpucloud):
    missing = gpucloud("launch", "--template", "nope")
    assert missing.returncode == 1 and "No template nope" in missing.stderr
    nothing = gpucloud("launch")
    assert nothing.returncode == 1 and "give --spec, or --template" in nothing.stderr
    unset = gpucloud("launch", "--spec", "a100-quarter", "--secret", "NOT_SET_HERE")
    assert unset.returncode == 1 and "--secret NOT_SET_HERE" in unset.stderr
    assert not Instance.objects.exists()
