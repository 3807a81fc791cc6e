"""Members' public SSH keys: parsed and fingerprinted with asyncssh (the library the host
agents' SSH gateway uses), so a key the console accepts is one the gateway can check."""

import re

import asyncssh
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from accounts.models import Membership, SshKey
from accounts.roles import OPERATE

MIN_RSA_BITS = 2048
ALGORITHMS = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
MAX_KEY_CHARS = 16384


def parse_public_key(text: str) -> tuple[str, str]:
    """The key as one OpenSSH line (its comment kept) and its SHA256 fingerprint; a
    ValidationError on `public_key` for anything else than an ed25519, ECDSA or RSA (at least
    2048 bits) public key."""
    text = (text or "").strip()
    if not text:
        raise ValidationError({"public_key": "Paste a public key (the contents of ~/.ssh/*.pub)."})
    if "PRIVATE KEY" in text:
        raise ValidationError(
            {
                "public_key": "This is a private key: never share it. Paste the public key "
                "(the .pub file, e.g. ~/.ssh/id_ed25519.pub) instead."
            }
        )
    if len(text) > MAX_KEY_CHARS:
        raise ValidationError({"public_key": "This is too long to be a public key."})
    try:
        key = asyncssh.import_public_key(text)
    except (asyncssh.KeyImportError, ValueError, TypeError):
        raise ValidationError(
            {
                "public_key": "Not an SSH public key: expected a line like "
                "'ssh-ed25519 AAAAC3… you@laptop'."
            }
        ) from None
    algorithm = key.get_algorithm()
    if algorithm == "ssh-rsa":
        bits = key.pyca_key.key_size
        if bits < MIN_RSA_BITS:
            raise ValidationError(
                {
                    "public_key": f"This RSA key has {bits} bits, which is too weak: use at "
                    f"least {MIN_RSA_BITS} bits, or better an ed25519 key (ssh-keygen -t ed25519)."
                }
            )
    elif algorithm not in ALGORITHMS:
        raise ValidationError(
            {
                "public_key": f"{algorithm} keys are not accepted: use ssh-ed25519, "
                "ecdsa-sha2-nistp256/384/521 or ssh-rsa (2048 bits or more)."
            }
        )
    line = key.export_public_key("openssh").decode().strip()
    return line, key.get_fingerprint("sha256")


def add_ssh_key(membership: Membership, name: str, public_key: str) -> SshKey:
    """Keep a public key for `membership` (its user, in its tenant) under `name`."""
    name = (name or "").strip()
    errors = {}
    if not NAME.fullmatch(name):
        errors["name"] = (
            "Use 1 to 64 letters, digits, dots, hyphens, underscores or @, starting with a "
            "letter or digit."
        )
    try:
        line, fingerprint = parse_public_key(public_key)
    except ValidationError as error:
        errors.update(error.message_dict)
    if not errors and membership.ssh_keys.filter(name=name).exists():
        errors["name"] = f"You already have a key named {name}."
    if not errors and membership.ssh_keys.filter(fingerprint=fingerprint).exists():
        errors["public_key"] = "You already added this key."
    if errors:
        raise ValidationError(errors)
    try:
        with transaction.atomic():
            return SshKey.objects.create(
                membership=membership, name=name, public_key=line, fingerprint=fingerprint
            )
    except IntegrityError:
        raise ValidationError({"name": f"You already have a key named {name}."}) from None


@transaction.atomic
def delete_ssh_key(key: SshKey) -> None:
    """The key opens no instance any more (the instances app pushes the new key sets to the
    hosts when this commits)."""
    key.delete()


def grants_shell(membership: Membership) -> bool:
    """Whether the member's keys may open a shell: role member or above (never a viewer)."""
    return membership.can(OPERATE) and membership.user.is_active
