"""`gpucloud launch --wait` prints an image pull's progress as it changes: a line for each new
state or reason, none while nothing moved."""

import pytest

from cli import wait
from cli.errors import CliError

REF = "registry.example/team/pytorch:2.4"


class Api:
    """The instance as the API answers it, poll after poll."""

    def __init__(self, *answers):
        self.answers = list(answers)

    def call(self, method, path):
        assert (method, path) == ("GET", "instances/7/")
        return self.answers.pop(0)


def seen(state, reason=""):
    return {"id": 7, "name": "cold", "state": state, "reason_text": reason}


@pytest.fixture(autouse=True)
def quick(monkeypatch):
    monkeypatch.setattr(wait, "POLL_SECONDS", 0)


def test_each_new_report_of_a_pull_is_a_line(capsys):
    api = Api(
        seen("provisioning", f"pulling {REF}: 1 of 3 layers · 1.2 GB of 3.4 GB"),
        seen("provisioning", f"pulling {REF}: 1 of 3 layers · 1.2 GB of 3.4 GB"),
        seen("provisioning", f"pulling {REF}: 3 of 3 layers · 3.4 GB of 3.4 GB"),
        seen("running"),
    )
    assert wait.wait_until_running(api, seen("pending"), timeout=10)["state"] == "running"
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        "cold: pending",
        f"cold: provisioning (pulling {REF}: 1 of 3 layers · 1.2 GB of 3.4 GB)",
        f"cold: provisioning (pulling {REF}: 3 of 3 layers · 3.4 GB of 3.4 GB)",
        "cold: running",
    ]


def test_a_pull_that_fails_ends_the_wait_with_its_reason(capsys):
    api = Api(
        seen("provisioning", f"pulling {REF}: 0 of 3 layers"),
        seen("failed", f"image_pull_failed: {REF}: unauthorized"),
    )
    with pytest.raises(CliError, match=f"cold is failed: image_pull_failed: {REF}"):
        wait.wait_until_running(api, seen("pending"), timeout=10)
    assert len(capsys.readouterr().err.splitlines()) == 3
