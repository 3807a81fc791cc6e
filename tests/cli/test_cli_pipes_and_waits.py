"""`gpucloud … | head` ends quietly when the reader goes away, and `launch --wait` gives up
after --timeout, against a live console."""

import json
import os
import subprocess
import sys

import pytest

from tests.cli.test_cli import cli  # noqa: F401 - the fixture

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.integration
def test_a_closed_pipe_ends_the_command_quietly(cli):  # noqa: F811
    for name in ("one", "two"):
        assert cli("launch", name, "--spec", "a100-quarter")[0] == 0
    read, write = os.pipe()
    os.close(read)  # the reader (`head`) has gone before anything is written
    try:
        listed = subprocess.run(
            [sys.executable, "-m", "cli.main", "instances"],
            stdout=write, stderr=subprocess.PIPE, text=True, timeout=60,
        )  # fmt: skip
    finally:
        os.close(write)
    assert listed.stderr == ""  # no BrokenPipeError traceback, no "Exception ignored"
    assert listed.returncode == 141  # as a tool that SIGPIPE ended


def test_launch_wait_gives_up_after_its_timeout(cli):  # noqa: F811
    # The fixture's only host is cordoned: the instance waits in the queue.
    code, out, err = cli(
        "--json", "launch", "queued", "--spec", "a100-quarter", "--wait", "--timeout", "1"
    )
    assert code == 1 and out == ""
    pk = json.loads(cli("--json", "instances")[1])[0]["id"]
    *waited, gave_up = err.splitlines()  # a line each time its state or reason changed
    assert waited and all(line.startswith("queued: pending") for line in waited), waited
    assert "capacity" in waited[-1]  # and why it waits
    assert gave_up == (
        f"gpucloud: queued is still pending after 1 s: follow it with `gpucloud show {pk}`"
    )
