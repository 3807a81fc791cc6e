"""The CLI asks before what ends an instance's processes (stop, reboot, terminate, a resize
that restarts or stops it), answers for the user with --yes, and refuses without a terminal
to ask on."""

import io

import pytest

from accounts.roles import Role
from cli.main import main
from console.catalog.models import Mode
from console.instances import outcomes, services
from console.instances.models import Instance, State
from tests.instances.conftest import Catalog

pytestmark = pytest.mark.django_db(transaction=True)


class Terminal(io.StringIO):
    """A terminal on stdin whose user types `answer`."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def running(live_server, tenant, make_member, token_client, monkeypatch, tmp_path):
    """A running instance named `box` (a quarter of a shared GPU, alone on it) and a CLI
    configured for a member of its tenant."""
    catalog = Catalog()
    catalog.host(gpus=1, mode=Mode.SHARED)
    instance = services.launch_instance(
        tenant, name="box", spec=catalog.quarter, image=catalog.image
    )
    outcomes.mark_running(instance.pk, instance.current_allocation().pk)
    client = token_client(make_member(tenant, Role.MEMBER))
    monkeypatch.setenv("GPUCLOUD_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.setenv("GPUCLOUD_URL", live_server.url)
    monkeypatch.setenv("GPUCLOUD_TOKEN", client.raw_token)
    return instance


def cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def state(instance) -> str:
    return Instance.objects.get(pk=instance.pk).state


@pytest.mark.parametrize("action", ["stop", "reboot", "terminate"])
def test_without_a_terminal_it_refuses_unless_yes(running, capsys, action):
    code, _, err = cli(capsys, action, "box")
    assert code == 1
    assert f"{action.capitalize()} box? Every process in it ends" in err
    assert "There is no terminal to ask on: give --yes to confirm." in err
    assert state(running) == State.RUNNING
    code, out, _ = cli(capsys, action, "box", "--yes")
    assert code == 0 and state(running) != State.RUNNING


def test_on_a_terminal_it_asks_and_no_leaves_it_running(running, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", Terminal("n\n"))
    code, _, err = cli(capsys, "stop", "box")
    assert (code, state(running)) == (1, State.RUNNING)
    assert "[y/N]" in err and "Nothing was done." in err
    monkeypatch.setattr("sys.stdin", Terminal("y\n"))
    code, out, _ = cli(capsys, "stop", "box")
    assert code == 0 and "stopping" in out
    assert state(running) == State.STOPPING


def test_a_restarting_resize_asks_and_sends_allow_restart(running, capsys, monkeypatch):
    code, _, err = cli(capsys, "resize", "box", "--spec", "a100-half")
    assert code == 1 and "restarts it on its GPU" in err and "give --yes" in err
    assert Instance.objects.get(pk=running.pk).spec.code == "a100-quarter"
    monkeypatch.setattr("sys.stdin", Terminal("yes\n"))
    code, out, err = cli(capsys, "resize", "box", "--spec", "a100-half")
    assert code == 0 and "Go on? [y/N]" in err and "rebooting" in out
    resized = Instance.objects.get(pk=running.pk)
    assert (resized.state, resized.spec.code) == (State.REBOOTING, "a100-half")


def test_a_resize_with_yes_asks_nothing(running, capsys):
    code, out, err = cli(capsys, "resize", "box", "--spec", "a100-half", "--yes")
    assert code == 0 and "rebooting" in out and "[y/N]" not in err
