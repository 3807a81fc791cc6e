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


def pulling(layers_done, bytes_done, eta, done=False):
    figures = {
        "reference": REF, "layers_done": layers_done, "layers_total": 4,
        "bytes_done": bytes_done, "bytes_total": 3_400_000_000, "eta_seconds": eta, "done": done,
    }  # fmt: skip
    return {**seen("provisioning", f"pulling {REF}: …"), "pull_progress": figures}


def test_a_pull_is_a_bar_with_its_eta_one_plain_line_a_report_when_not_a_terminal(capsys):
    api = Api(
        pulling(1, 850_000_000, 90),
        pulling(1, 850_000_000, 90),  # nothing moved: no line
        pulling(3, 1_700_000_000, 45),
        pulling(4, 3_400_000_000, 0, done=True),
        seen("running"),
    )
    assert wait.wait_until_running(api, seen("pending"), timeout=10)["state"] == "running"
    assert capsys.readouterr().err.splitlines() == [
        "cold: pending",
        f"cold: pulling {REF} [######------------------]  25% 1 of 4 layers · 850.0 MB of "
        "3.4 GB · ETA 2 min",
        f"cold: pulling {REF} [############------------]  50% 3 of 4 layers · 1.7 GB of 3.4 GB"
        " · ETA 45 s",
        f"cold: pulling {REF} [########################] 100% 4 of 4 layers · 3.4 GB of 3.4 GB",
        "cold: running",
    ]


def test_on_a_terminal_the_bar_is_redrawn_in_place(capsys, monkeypatch):
    monkeypatch.setattr(wait.sys.stderr, "isatty", lambda: True, raising=False)
    api = Api(pulling(1, 850_000_000, 90), pulling(3, 1_700_000_000, 45), seen("running"))
    wait.wait_until_running(api, seen("pending"), timeout=10)
    err = capsys.readouterr().err
    assert err.count("\r") == 2 and err.count("\x1b[K") == 2
    assert err.endswith("ETA 45 s\x1b[K\ncold: running\n")


def test_a_bar_counts_layers_while_no_size_is_known():
    figures = {"reference": REF, "layers_done": 1, "layers_total": 2, "bytes_done": 0,
               "bytes_total": 0, "eta_seconds": None}  # fmt: skip
    assert wait.bar(figures) == "[############------------]  50% 1 of 2 layers"
