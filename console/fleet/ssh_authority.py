"""The console's SSH keys: its certificate authority and the SSH front's host key.

Users reach an instance with `ssh -J ID@FRONT ID@gpucloud`: the front (console/instances/
ssh_front.py) routes the jump to the gateway of the host the instance runs on now, and the
client checks that gateway's key against one known_hosts line, `@cert-authority gpucloud …`,
because every gateway presents a host certificate this CA signed for the name `gpucloud`.
So the line and the client's known_hosts stay the same when the instance moves to another host
(an unshelve, a failover).

Both keys are generated once into files (SSH_CA_KEY_FILE, SSH_FRONT_HOST_KEY_FILE, in var/ by
default); every console machine needs the same two files, as it needs the same SECRET_KEY."""

import contextlib
import functools
import os
import secrets
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncssh
from django.conf import settings
from django.utils import timezone

from console import integers

# The name users' ssh gives the instance behind the front: the certificates' one principal.
INSTANCE_HOST = "gpucloud"
VALID_DAYS = 90
RENEW_DAYS = 30  # a certificate is renewed this long before it expires


@functools.cache
def _key(path: str) -> asyncssh.SSHKey:
    """The private key in `path`, generated there (0600) by whichever process comes first.
    Each process writes its key whole into a file of its own, then links it to `path`, which
    only the first link gets: no process ever reads a key another is still writing."""
    target = Path(path)
    if not target.exists():
        written = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(written, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(asyncssh.generate_private_key("ssh-ed25519").export_private_key())
                f.flush()
                os.fsync(f.fileno())
            with contextlib.suppress(FileExistsError):
                os.link(written, target)
        finally:
            written.unlink()
    return asyncssh.import_private_key(target.read_bytes())


def authority() -> asyncssh.SSHKey:
    return _key(str(settings.SSH_CA_KEY_FILE))


def front_key() -> asyncssh.SSHKey:
    return _key(str(settings.SSH_FRONT_HOST_KEY_FILE))


def public_line(key: asyncssh.SSHKey) -> str:
    """`ssh-ed25519 AAAA…`: the key as known_hosts holds it (no comment)."""
    return " ".join(key.export_public_key().decode().split()[:2])


def fingerprint(key: asyncssh.SSHKey) -> str:
    return key.get_fingerprint("sha256")


def gateway_key(line: str, expected_fingerprint: str) -> str:
    """The public key an agent reports for its gateway as one OpenSSH line, when it is one and
    has the fingerprint it reports beside it; else ""."""
    try:
        key = asyncssh.import_public_key(line)
    except (asyncssh.KeyImportError, ValueError, TypeError):
        return ""
    return public_line(key) if fingerprint(key) == expected_fingerprint else ""


def certified_until(reported) -> datetime | None:
    """Until when the certificate an agent reports (`{"authority", "valid_before"}`) holds, if
    this console's CA signed it."""
    if not isinstance(reported, dict) or reported.get("authority") != fingerprint(authority()):
        return None
    valid_before = reported.get("valid_before")
    if isinstance(valid_before, bool) or not isinstance(valid_before, int):
        return None
    try:
        return datetime.fromtimestamp(valid_before, UTC)
    except (OverflowError, OSError, ValueError):
        return None


def needs_certificate(host) -> bool:
    """Whether the host's gateway should be given a (new) certificate: the console runs an SSH
    front, the gateway is on, and it has none of this CA or one that expires soon."""
    if not settings.SSH_FRONT or not host.ssh_port or not host.ssh_host_key:
        return False
    expires = host.ssh_certificate_expires_at
    return expires is None or expires < timezone.now() + timedelta(days=RENEW_DAYS)


def uncertified(host, now: datetime | None = None) -> bool:
    """Whether the host's gateway is on but users cannot reach it through the SSH front: the
    console runs a front, and the gateway has no certificate of this CA, or an expired one
    (`ssh -J` then fails with "Host key verification failed" for every instance there)."""
    if not settings.SSH_FRONT or not host.ssh_port or not host.ssh_host_key:
        return False
    if host.status == host.Status.RETIRED:
        return False
    expires = host.ssh_certificate_expires_at
    return expires is None or expires <= (now or timezone.now())


def sign(host_key_line: str, host_name: str) -> tuple[str, datetime]:
    """A host certificate of the gateway's key for INSTANCE_HOST, and when it ends."""
    now = timezone.now()
    until = now + timedelta(days=VALID_DAYS)
    certificate = authority().generate_host_certificate(
        asyncssh.import_public_key(host_key_line),
        host_name,
        principals=[INSTANCE_HOST],
        valid_after=int((now - timedelta(minutes=5)).timestamp()),  # hosts' clocks differ
        valid_before=int(until.timestamp()),
    )
    return certificate.export_certificate().decode(), until


def front_address() -> tuple[str, int]:
    """Where users reach the front: SSH_FRONT, `host:port` (`[v6]:port`; port 22 by default)."""
    host, _, port = settings.SSH_FRONT.rpartition(":")
    with contextlib.suppress(integers.NotAWholeNumber):
        if host:
            return host.strip("[]"), integers.parse(port, maximum=65535)
    return settings.SSH_FRONT.strip("[]"), 22


def known_hosts() -> list[str]:
    """The two lines a user's known_hosts needs: the front's key, and the CA for the gateways."""
    host, port = front_address()
    pattern = host if port == 22 else f"[{host}]:{port}"
    return [
        f"{pattern} {public_line(front_key())}",
        f"@cert-authority {INSTANCE_HOST} {public_line(authority())}",
    ]
