import json
import os
import re
import shlex

import pytest

from cli.main import main
from console.catalog.models import Mode
from console.fleet.models import Gpu, Host
from tests.factories import ImageFactory, RegionFactory, SpecFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cli(member_cli):
    region = RegionFactory()
    ImageFactory()
    spec = SpecFactory(code="a100-quarter")
    # Hardware that could hold the spec, taking nothing now: launches are accepted and queue.
    cordoned = Host.Status.CORDONED
    host = Host(name="cordoned", region=region, address="http://127.0.0.1:9", status=cordoned,
                admin_status=cordoned)  # fmt: skip
    host.set_secret("secret-cordoned")
    host.save()
    Gpu.objects.create(
        host=host, index=0, uuid="GPU-cordoned-0", model=spec.gpu_model, name="A100",
        memory_mib=81920, mode=Mode.SHARED,
    )  # fmt: skip
    return member_cli


def test_lists_specs_and_quota(cli):
    code, out, _ = cli("specs")
    assert code == 0
    assert "a100-quarter" in out
    assert "PRICE_PER_HOUR" in out.splitlines()[2]  # under the line that names the region
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
    assert "CHANGE" in out


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
    assert "total 0.00 USD" in out and "forecast" in out
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


def test_launch_with_a_restart_policy_and_what_to_do_when_its_host_is_lost(cli):
    code, out, _ = cli(
        "--json", "launch", "svc", "--spec", "a100-quarter", "--image", "pytorch-2.5-cuda12.4",
        "--restart", "always", "--on-host-loss", "fresh_disk",
    )  # fmt: skip
    assert code == 0
    instance = json.loads(out)
    assert (instance["restart_policy"], instance["on_host_loss"]) == ("always", "fresh_disk")
    code, out, _ = cli(
        "--json", "launch", "plain", "--spec", "a100-quarter", "--image", "pytorch-2.5-cuda12.4"
    )  # fmt: skip
    assert (json.loads(out)["restart_policy"], json.loads(out)["on_host_loss"]) == (
        "on-failure",  # the image's
        "keep_disk",
    )


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


def test_specs_say_what_fits_in_a_region(cli, tenant):
    from console.catalog.models import Region
    from console.fleet.models import Host
    from tests.factories import SpecFactory

    region = Region.objects.get()
    SpecFactory(code="big-8x", mode="whole", milli=None, gpu_count=8)  # over the quota of 2
    code, out, _ = cli("specs")
    assert code == 0
    assert out.splitlines()[0] == (
        f"In {region.code}: fits_now, queues (busy), no_hardware or over_quota"
    )
    rows = {line.split()[0]: line.split()[-1] for line in out.splitlines()[3:]}
    assert rows == {"a100-quarter": "queues", "big-8x": "no_hardware"}  # the host is cordoned
    host = Host.objects.create(name="h1", region=region, address="http://127.0.0.1:9")
    spec = SpecFactory._meta.model.objects.get(code="a100-quarter")
    host.gpus.create(index=0, uuid="GPU-h1-0", model=spec.gpu_model, name="A100",
                     memory_mib=81920, mode="shared")  # fmt: skip
    code, out, _ = cli("--json", "specs", "--region", region.code)
    found = {s["code"]: s["availability"]["status"] for s in json.loads(out)}
    assert found == {"a100-quarter": "fits_now", "big-8x": "no_hardware"}
    code, _, err = cli("specs", "--region", "mars-1")
    assert code == 1 and "region: No region mars-1" in err


def test_show_by_name_with_how_to_reach_it(cli):
    code, out, _ = cli("--json", "launch", "trainer", "--spec", "a100-quarter")
    assert code == 0
    launched = json.loads(out)
    assert launched["image"] == "pytorch-2.5-cuda12.4"  # the first image, as in the form
    code, out, _ = cli("show", "trainer")
    assert code == 0
    assert "trainer" in out and "disk: " in out
    assert "∅ → pending" in out  # events by what changed; a note says "note"
    code, out, _ = cli("--json", "show", str(launched["id"]))
    assert json.loads(out)["id"] == launched["id"]
    code, _, err = cli("show", "nobody")
    assert code == 1 and "no live instance named 'nobody'" in err


def test_show_prints_the_ssh_command_and_port_urls(cli, monkeypatch):
    from cli import main as cli_main

    instance = {
        "id": 7, "name": "nb", "state": "running", "spec": "a100-quarter", "image": "x",
        "region": "local-1", "state_reason": "", "disk": {"size_gib": 50, "host": None},
        "ssh": {"command": "ssh -p 2222 7@gpu-1.example", "host_key_fingerprint": "SHA256:k"},
        "ports": [{"port": 8888, "name": "jupyter", "url": "http://c/instances/7/ports/8888/",
                   "origin_url": "http://i7-8888.ports.c/"}],
    }  # fmt: skip
    text = cli_main.describe(instance)
    assert text.splitlines() == [
        "ssh: ssh -p 2222 7@gpu-1.example",
        "ssh host key: SHA256:k",
        "jupyter (port 8888): http://c/instances/7/ports/8888/",
        "  with an API token: http://i7-8888.ports.c/",
        "disk: 50 GiB",
    ]


def test_instances_hide_terminated_ones_unless_all(cli, tenant):
    from console.instances.models import Instance

    for name in ("keep", "gone"):
        assert cli("launch", name, "--spec", "a100-quarter")[0] == 0
    Instance.objects.filter(name="gone").update(state="terminated")
    code, out, _ = cli("instances")
    assert "keep" in out and "gone" not in out
    code, out, _ = cli("instances", "--all")
    assert "keep" in out and "gone" in out
    code, out, _ = cli("instances", "--state", "terminated")
    assert "gone" in out and "keep" not in out


def test_an_unknown_spec_says_which_exist(cli):
    code, _, err = cli("launch", "x", "--spec", "nope")
    assert code == 1
    assert "spec: No spec nope. Specs: a100-quarter (GET /api/v1/specs/ describes them)." in err


def test_launch_without_a_name_or_an_image_gets_the_apis_defaults(cli):
    code, out, err = cli("--json", "launch", "--spec", "a100-quarter", "--disk-gib", "80")
    assert code == 0, err
    launched = json.loads(out)
    assert re.fullmatch(r"a100-quarter-[a-z]+-[a-z]+", launched["name"])
    assert launched["image"] == "pytorch-2.5-cuda12.4"  # the only image: the default
    assert launched["disk"]["size_gib"] == 80


def test_show_prints_the_command_as_a_line_that_gives_the_argv_back():
    command = ["sh", "-c", "echo start SEED=$SEED"]
    from cli import main as cli_main

    (line,) = cli_main.describe({"command": command}).splitlines()
    assert line == "command: sh -c 'echo start SEED=$SEED'"
    assert shlex.split(line.removeprefix("command: ")) == command


def test_images_say_whether_a_region_can_run_each(cli):
    from console.catalog.models import Region
    from console.fleet.models import HostImage

    region = Region.objects.get()
    settings = {"pre_pull": [], "mirror": "", "registries": ["docker.io", "quay.io"]}
    checks = [
        {"registry": "docker.io", "reachable": True, "error": "", "checked_at": 1.0},
        {"registry": "quay.io", "reachable": False, "error": "timed out", "checked_at": 1.0},
    ]
    Host.objects.update(image_settings=settings, registry_checks=checks)
    HostImage.objects.create(host=Host.objects.get(), reference="docker.io/library/python:3.12",
                             image_id="sha256:1", size_bytes=1_020_000_000)  # fmt: skip
    ImageFactory(name="python", reference="python:3.12", description="Python")
    ImageFactory(name="quay-one", reference="quay.io/team/one:1", description="From Quay")
    ImageFactory(name="jupyter", reference="localhost/gpucloud/jupyter", description="JupyterLab")
    code, out, _ = cli("images")
    assert code == 0
    assert out.splitlines()[0].startswith(f"In {region.code}: held (on its hosts), mirror")
    assert "AVAILABILITY" in out.splitlines()[2]
    rows = {line.split()[0]: line for line in out.splitlines()[3:]}
    assert " 1.0 GB " in rows["python"] and " held " in rows["python"]
    assert " unreachable " in rows["quay-one"]
    assert " not_built " in rows["jupyter"]
    assert " registry " in rows["pytorch-2.5-cuda12.4"]  # docker.io: reached, not held
    code, out, _ = cli("--json", "images", "--region", region.code)
    found = {image["name"]: image["availability"] for image in json.loads(out)}
    assert found["quay-one"]["detail"].startswith(f"No host of {region.name} can reach quay.io")
    assert found["python"]["hosts"] == ["cordoned"]
