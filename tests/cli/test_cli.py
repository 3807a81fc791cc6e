import json
import os

import pytest

from accounts.roles import Role
from cli.main import main
from tests.factories import ImageFactory, RegionFactory, SpecFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cli(live_server, tenant, make_member, token_client, monkeypatch, tmp_path, capsys):
    RegionFactory()
    ImageFactory()
    SpecFactory(code="a100-quarter")
    client = token_client(make_member(tenant, Role.MEMBER))
    monkeypatch.setenv("GPUCLOUD_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.setenv("GPUCLOUD_URL", live_server.url)
    monkeypatch.setenv("GPUCLOUD_TOKEN", client.raw_token)

    def run(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_lists_specs_and_quota(cli):
    code, out, _ = cli("specs")
    assert code == 0
    assert "a100-quarter" in out
    assert "PRICE_PER_HOUR" in out.splitlines()[0]
    code, out, _ = cli("--json", "quota")
    assert json.loads(out)["gpu_quota"] == "2"


def test_launch_show_and_list(cli):
    code, out, _ = cli(
        "--json", "launch", "trainer", "--spec", "a100-quarter", "--image", "pytorch-2.5-cuda12.4"
    )
    assert code == 0
    instance = json.loads(out)
    assert instance["name"] == "trainer"
    assert instance["state"] == "pending"
    code, out, _ = cli("instances", "--state", "pending")
    assert "trainer" in out
    code, out, _ = cli("show", str(instance["id"]))
    assert "pending" in out
    assert "TO_STATE" in out


def test_errors_are_clear_and_exit_non_zero(cli, monkeypatch):
    code, _, err = cli("launch", "x", "--spec", "nope", "--image", "pytorch-2.5-cuda12.4")
    assert code == 1
    assert "spec:" in err
    code, _, err = cli("stop", "999999")
    assert code == 1
    assert "not_found" in err
    monkeypatch.setenv("GPUCLOUD_TOKEN", "gpc_00000000_wrong")
    code, _, err = cli("quota")
    assert code == 1
    assert "invalid_token" in err


def test_login_saves_the_config(cli, live_server, monkeypatch, tmp_path):
    token = os.environ["GPUCLOUD_TOKEN"]
    monkeypatch.delenv("GPUCLOUD_TOKEN")
    monkeypatch.delenv("GPUCLOUD_URL")
    code, _, _ = cli("login", "--url", live_server.url, "--token", token)
    assert code == 0
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved == {"url": live_server.url, "token": token}
    code, out, _ = cli("quota")
    assert code == 0
    assert "gpu_quota: 2" in out


def test_usage_and_invoices(cli):
    code, out, _ = cli("usage")
    assert code == 0
    assert "total 0" in out and "forecast" in out
    code, out, _ = cli("invoices")
    assert code == 0
    code, out, _ = cli("usage", "--month", "2026-13")
    assert code == 1


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", "\xff\xfe"])
def test_a_corrupt_config_file_is_one_clear_line_and_exit_1(monkeypatch, tmp_path, capsys, content):
    path = tmp_path / "config.json"
    path.write_bytes(content.encode("latin-1"))
    monkeypatch.setenv("GPUCLOUD_CONFIG", str(path))
    assert main(["quota"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"gpucloud: {path}") or err.startswith(f"gpucloud: cannot read {path}")
    assert "gpucloud login" in err
    assert len(err.strip().splitlines()) == 1


def test_launch_with_a_command_and_env(cli):
    code, out, _ = cli(
        "--json", "launch", "job", "--spec", "a100-quarter", "--image", "pytorch-2.5-cuda12.4",
        "--command", "sh -c 'echo hi; exit 3'", "--env", "SEED=7", "--env", "MODE=a=b",
    )  # fmt: skip
    assert code == 0
    instance = json.loads(out)
    assert instance["command"] == ["sh", "-c", "echo hi; exit 3"]
    assert instance["env"] == {"SEED": "7", "MODE": "a=b"}
    code, _, err = cli(
        "launch", "job2", "--spec", "a100-quarter", "--image", "pytorch-2.5-cuda12.4",
        "--env", "lower=x",
    )  # fmt: skip
    assert code == 1 and "env:" in err
    code, _, err = cli(
        "launch", "job3", "--spec", "a100-quarter", "--image", "pytorch-2.5-cuda12.4",
        "--env", "NOEQUALS",
    )  # fmt: skip
    assert code == 1 and "NAME=VALUE" in err


def test_logs_and_follow_until_it_ended(cli, tenant, monkeypatch):
    from console.catalog.models import Image, Region, Spec
    from console.fleet.models import Host
    from console.instances.models import Instance, State
    from tests.instances.fakes import FakeAgents

    agents = FakeAgents().install(monkeypatch)
    host = Host(name="gpu-a", region=Region.objects.first(), address="http://127.0.0.1:9")
    host.set_secret("s")
    host.save()
    instance = Instance.objects.create(
        tenant=tenant, name="job", spec=Spec.objects.get(code="a100-quarter"),
        image=Image.objects.first(), region=host.region, state=State.STOPPED, disk_host=host,
    )  # fmt: skip
    agents.logs["gpu-a"] = {str(instance.pk): ["hi", "epoch 1", "done"]}
    code, out, _ = cli("logs", str(instance.pk), "--tail", "2")
    assert (code, out) == (0, "epoch 1\ndone\n")
    code, out, _ = cli("logs", "-f", str(instance.pk))  # it has ended: prints, then returns
    assert (code, out) == (0, "hi\nepoch 1\ndone\n")
    code, _, err = cli("logs", "999999")
    assert code == 1 and "not_found" in err


@pytest.mark.parametrize(
    "seen, lines, new",
    [
        ([], ["a", "b"], ["a", "b"]),
        (["a", "b"], ["a", "b"], []),
        (["a", "b", "c"], ["b", "c", "d"], ["d"]),
        (["x", "x"], ["x", "x", "y"], ["y"]),
        (["a"], ["z"], ["z"]),  # the window moved past all it had shown
    ],
)
def test_follow_prints_only_what_is_new(seen, lines, new):
    from cli.main import new_lines

    assert new_lines(seen, lines) == new
