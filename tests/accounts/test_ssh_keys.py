"""Members' SSH keys: what is accepted (ed25519, ECDSA, RSA ≥ 2048) and what is refused,
with a field error a user can act on; the API per role and tenant."""

import asyncssh
import pytest
from django.core.exceptions import ValidationError

from accounts.roles import Role
from accounts.ssh_keys import add_ssh_key, parse_public_key


def public_key(algorithm="ssh-ed25519", comment="mia@laptop", **kwargs) -> str:
    key = asyncssh.generate_private_key(algorithm, comment=comment, **kwargs)
    return key.export_public_key().decode()


@pytest.mark.parametrize(
    ("algorithm", "kwargs"),
    [
        ("ssh-ed25519", {}),
        ("ecdsa-sha2-nistp256", {}),
        ("ecdsa-sha2-nistp384", {}),
        ("ssh-rsa", {"key_size": 2048}),
    ],
)
def test_accepted_keys_are_fingerprinted_like_ssh_keygen(algorithm, kwargs):
    text = public_key(algorithm, **kwargs)
    line, fingerprint = parse_public_key("  " + text + "\n")
    assert line == text.strip()
    assert line.startswith(algorithm + " ") and line.endswith(" mia@laptop")
    assert fingerprint == asyncssh.import_public_key(text).get_fingerprint("sha256")
    assert fingerprint.startswith("SHA256:")


def field_error(text: str) -> str:
    with pytest.raises(ValidationError) as caught:
        parse_public_key(text)
    return " ".join(caught.value.message_dict["public_key"])


def test_a_weak_rsa_key_is_refused_saying_how_many_bits():
    message = field_error(public_key("ssh-rsa", key_size=1024))
    assert "1024 bits" in message and "2048" in message


@pytest.mark.parametrize(
    "text",
    ["", "hello", "ssh-ed25519 AAAAgarbage me", "ssh-ed25519", "ssh-rsa " + "A" * 400],
)
def test_garbage_is_not_a_key(text):
    assert field_error(text)


def test_a_pasted_private_key_is_refused_and_not_kept(db, tenant, make_member):
    private = asyncssh.generate_private_key("ssh-ed25519").export_private_key().decode()
    assert "private key" in field_error(private)
    member = make_member(tenant)
    with pytest.raises(ValidationError):
        add_ssh_key(member, "oops", private)
    assert not member.ssh_keys.exists()


def test_names_are_unique_per_member_not_per_tenant(db, tenant, make_member):
    mia, max_ = make_member(tenant), make_member(tenant)
    add_ssh_key(mia, "laptop", public_key())
    add_ssh_key(max_, "laptop", public_key())
    with pytest.raises(ValidationError) as caught:
        add_ssh_key(mia, "laptop", public_key())
    assert "already have a key named laptop" in caught.value.message_dict["name"][0]
    with pytest.raises(ValidationError) as caught:
        add_ssh_key(mia, "a name with spaces", public_key())
    assert "name" in caught.value.message_dict


def test_the_same_key_twice_is_refused(db, tenant, make_member):
    mia = make_member(tenant)
    text = public_key()
    add_ssh_key(mia, "laptop", text)
    with pytest.raises(ValidationError) as caught:
        add_ssh_key(mia, "again", text)
    assert "already added" in caught.value.message_dict["public_key"][0]


# --- the API ------------------------------------------------------------------------------


def test_a_member_adds_lists_and_deletes_keys(db, tenant, make_member, token_client):
    client = token_client(make_member(tenant, Role.MEMBER))
    text = public_key()
    created = client.post(
        "/api/v1/ssh-keys/", {"name": "laptop", "public_key": text}, format="json"
    )
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["name"] == "laptop" and body["public_key"] == text.strip()
    assert body["fingerprint"].startswith("SHA256:") and body["created_at"]
    listed = client.get("/api/v1/ssh-keys/").json()
    assert [k["name"] for k in listed["results"]] == ["laptop"]
    assert client.delete("/api/v1/ssh-keys/laptop/").status_code == 204
    assert client.get("/api/v1/ssh-keys/").json()["results"] == []


def test_bad_keys_are_field_errors(db, tenant, make_member, token_client):
    client = token_client(make_member(tenant))
    weak = public_key("ssh-rsa", key_size=1024)
    answer = client.post("/api/v1/ssh-keys/", {"name": "old", "public_key": weak}, format="json")
    assert answer.status_code == 400
    assert "1024 bits" in " ".join(answer.json()["errors"]["public_key"])
    answer = client.post("/api/v1/ssh-keys/", {"name": "x", "public_key": "junk"}, format="json")
    assert answer.status_code == 400 and "public_key" in answer.json()["errors"]


def test_a_viewer_cannot_add_keys(db, tenant, make_member, token_client):
    client = token_client(make_member(tenant, Role.VIEWER))
    answer = client.post(
        "/api/v1/ssh-keys/", {"name": "laptop", "public_key": public_key()}, format="json"
    )
    assert answer.status_code == 403
    assert client.get("/api/v1/ssh-keys/").status_code == 200


def test_other_members_and_tenants_keys_are_not_seen(
    db, tenant, other_tenant, make_member, token_client
):
    mia = make_member(tenant, username="mia")
    add_ssh_key(mia, "laptop", public_key())
    for stranger in (make_member(tenant, Role.ADMIN), make_member(other_tenant, Role.OWNER)):
        client = token_client(stranger)
        assert client.get("/api/v1/ssh-keys/").json()["results"] == []
        assert client.get("/api/v1/ssh-keys/laptop/").status_code == 404
        assert client.delete("/api/v1/ssh-keys/laptop/").status_code == 404
    assert mia.ssh_keys.count() == 1
