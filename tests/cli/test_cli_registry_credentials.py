"""`gpucloud registry-credentials …` and `launch --image-ref`: the token is read from stdin
(or a prompt), never taken as an argument nor printed; a member is refused their management."""

import io
import json

import pytest

from accounts.roles import Role
from cli.errors import CliError
from cli.registry_credentials import read_secret
from console.instances.models import Instance
from console.registry_credentials.models import RegistryCredential
from tests.cli.test_cli import cli  # noqa: F401 - a fixture of these tests

pytestmark = pytest.mark.django_db(transaction=True)
SECRET = "cli-tok-Zx81-distinctive"


@pytest.fixture
def admin_cli(cli, tenant, make_member, token_client, monkeypatch):  # noqa: F811
    client = token_client(make_member(tenant, Role.ADMIN))
    monkeypatch.setenv("GPUCLOUD_TOKEN", client.raw_token)
    return cli


def test_add_list_and_remove(admin_cli, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(f"{SECRET}\n"))
    code, out, err = admin_cli("registry-credentials", "add", "ghcr.io", "ci-bot")
    assert code == 0, err
    assert out == "Saved the credential for ghcr.io (ci-bot).\n" and SECRET not in out + err
    code, out, _ = admin_cli("--json", "registry-credentials", "list")
    rows = json.loads(out)
    assert [(r["registry"], r["username"]) for r in rows] == [("ghcr.io", "ci-bot")]
    assert SECRET not in out
    code, out, _ = admin_cli("registry-credentials", "remove", "ghcr.io")
    assert (code, out) == (0, "Removed the credential for ghcr.io.\n")
    assert not RegistryCredential.objects.exists()
    code, _, err = admin_cli("registry-credentials", "remove", "ghcr.io")
    assert code == 1 and "no credential for ghcr.io" in err


def test_a_member_may_not_manage_them(cli, monkeypatch):  # noqa: F811
    monkeypatch.setattr("sys.stdin", io.StringIO(f"{SECRET}\n"))
    code, _, err = cli("registry-credentials", "add", "ghcr.io", "ci-bot")
    assert code == 1 and SECRET not in err
    assert not RegistryCredential.objects.exists()


def test_the_secret_comes_from_stdin_or_a_prompt():
    assert read_secret(io.StringIO("tok\n")) == "tok"

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    assert read_secret(Terminal(), ask=lambda prompt: "typed") == "typed"
    with pytest.raises(CliError, match="no token given"):
        read_secret(io.StringIO(""))


def test_launch_by_reference(cli):  # noqa: F811
    code, out, err = cli(
        "--json", "launch", "own", "--spec", "a100-quarter", "--image-ref", "ghcr.io/team/app:1"
    )
    assert code == 0, err
    assert json.loads(out)["image_reference"] == "ghcr.io/team/app:1"
    assert Instance.objects.get().image_reference == "ghcr.io/team/app:1"
    code, _, err = cli("launch", "bad", "--spec", "a100-quarter", "--image-ref", "ubuntu")
    assert code == 1 and "Name the registry" in err
