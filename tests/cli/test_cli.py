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
