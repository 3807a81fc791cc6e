"""Fixtures of the CLI tests."""

import pytest

from accounts.roles import Role
from cli.main import main
from console.fleet.models import Host
from console.instances.models import Instance, State
from tests.factories import ImageFactory, RegionFactory, SpecFactory


@pytest.fixture
def member_cli(live_server, tenant, make_member, token_client, monkeypatch, tmp_path, capsys):
    """`gpucloud` run in this process against the live server as a member of the tenant, with a
    config file of the test's own: call it with the command's words; answers its exit code,
    output and errors."""
    client = token_client(make_member(tenant, Role.MEMBER))
    monkeypatch.setenv("GPUCLOUD_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.setenv("GPUCLOUD_URL", live_server.url)
    monkeypatch.setenv("GPUCLOUD_TOKEN", client.raw_token)

    def run(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def keeper(tenant):
    """A stopped instance `keeper` of the tenant, its 20 GiB disk on host h1 (whose agent never
    answers: the agents' side is the end-to-end tests')."""
    region = RegionFactory()
    host = Host(name="h1", region=region, address="http://127.0.0.1:9")
    host.set_secret("secret-h1")
    host.save()
    return Instance.objects.create(
        tenant=tenant, name="keeper", spec=SpecFactory(code="a100-quarter"),
        image=ImageFactory(), region=region, state=State.STOPPED, disk_host=host, disk_gib=20,
    )  # fmt: skip
