"""The SSH gateway presents the host certificate the console's CA signed for its key (what lets
users behind the SSH front trust whichever host their instance runs on), keeps it across a
restart, and takes no certificate that is not one of its own key, not a host one, or not valid
now."""

import asyncio
import time

import asyncssh
import httpx
import pytest

from tests.agent.test_access import gateway, keys  # noqa: F401 - the fixtures

pytestmark = pytest.mark.containers
CA = asyncssh.generate_private_key("ssh-ed25519")


def _certificate(key, *, host=True, signer=CA, valid=(-300, 3600)) -> str:
    now = int(time.time())
    make = signer.generate_host_certificate if host else signer.generate_user_certificate
    certificate = make(
        key,
        "gpu-1",
        principals=["gpucloud"],
        valid_after=now + valid[0],
        valid_before=now + valid[1],
    )
    return certificate.export_certificate().decode()


def _known_hosts(tmp_path):
    path = tmp_path / "known_hosts"
    path.write_text(f"@cert-authority gpucloud {CA.export_public_key().decode()}")
    return str(path)


async def _login(port, instance, key, known_hosts, alias="gpucloud") -> str:
    """Log in as ssh does behind the front: the CA as the only known host line, the gateway
    named `gpucloud`."""
    async with asyncssh.connect(
        "127.0.0.1", port, username=instance, client_keys=[key], known_hosts=known_hosts,
        host_key_alias=alias, agent_path=None,
    ) as conn:  # fmt: skip
        return (await conn.run("echo inside", check=True)).stdout


def test_a_certified_gateway_is_trusted_through_the_ca_and_stays_so_after_a_restart(
    gateway, keys, tmp_path, start_agent, container_engine  # noqa: F811
):  # fmt: skip
    agent, port, instance = gateway
    laptop = keys["laptop"][0]
    known_hosts = _known_hosts(tmp_path)
    # No host key the client can take: the key exchange fails, and the gateway may close the
    # connection before its reason reaches the client (then it is only a lost connection).
    refused = (asyncssh.HostKeyNotVerifiable, asyncssh.KeyExchangeFailed, asyncssh.ConnectionLost)
    with pytest.raises(refused):
        asyncio.run(_login(port, instance, laptop, known_hosts))
    host_key = asyncssh.import_public_key(
        agent.client.get("/v1/inventory").json()["ssh"]["host_key"]
    )
    before = agent.client.get("/v1/inventory").json()["digest"]
    put = agent.client.put("/v1/ssh/host-certificate", json={"certificate": _certificate(host_key)})
    assert put.status_code == 200, put.text
    offered = agent.client.get("/v1/inventory").json()
    assert offered["ssh"]["certificate"]["authority"] == CA.get_fingerprint("sha256")
    assert offered["digest"] != before  # the console learns of it with the next heartbeat
    assert asyncio.run(_login(port, instance, laptop, known_hosts)) == "inside\n"
    plain = tmp_path / "plain"  # who pinned the gateway's own key is let in as before
    plain.write_text(f"[127.0.0.1]:{port} {host_key.export_public_key().decode()}")
    assert asyncio.run(_login(port, instance, laptop, str(plain), alias=None)) == "inside\n"

    agent.kill()  # the container runs on; the agent adopts it again with its keys
    again = start_agent(
        "--gpus", "2", "--runtime", "oci", "--engine-url", container_engine.url,
        "--ssh-listen", f"127.0.0.1:{port}", state_dir=agent.state_dir,
    )  # fmt: skip
    assert again.client.get("/v1/inventory").json()["ssh"] == offered["ssh"]
    assert asyncio.run(_login(port, instance, laptop, known_hosts)) == "inside\n"


@pytest.mark.parametrize(
    "what, code",
    [
        ("another key", "wrong_key"),
        ("a user certificate", "invalid_certificate"),
        ("expired", "invalid_certificate"),
        ("not a certificate", "invalid_certificate"),
        ("no body", "invalid_body"),
    ],
)
def test_certificates_it_cannot_present_are_refused_and_change_nothing(gateway, what, code):  # noqa: F811
    agent = gateway[0]
    host_key = asyncssh.import_public_key(
        agent.client.get("/v1/inventory").json()["ssh"]["host_key"]
    )
    body = {
        "another key": {"certificate": _certificate(asyncssh.generate_private_key("ssh-ed25519"))},
        "a user certificate": {"certificate": _certificate(host_key, host=False)},
        "expired": {"certificate": _certificate(host_key, valid=(-7200, -3600))},
        "not a certificate": {"certificate": host_key.export_public_key().decode()},
        "no body": ["certificate"],
    }[what]
    refused = agent.client.put("/v1/ssh/host-certificate", json=body)
    assert refused.status_code == 400 and refused.json()["error"] == code, refused.text
    assert agent.client.get("/v1/inventory").json()["ssh"]["certificate"] is None


def test_only_the_consoles_credential_gives_a_certificate(gateway):  # noqa: F811
    agent = gateway[0]
    url = f"{agent.url}/v1/ssh/host-certificate"
    for headers in ({}, {"Authorization": "Bearer not-the-secret"}):
        assert httpx.put(url, json={"certificate": "x"}, headers=headers).status_code == 401
