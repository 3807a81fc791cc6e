"""`gpucloud ssh`: the system's OpenSSH client to an instance, with the host's key pinned.

Through the console's SSH front (the console reports a `proxy_jump`), the console also gives the
known_hosts lines that check whom ssh reaches: the front's key and its CA for every host's
gateway. They are written to the CLI's own known_hosts, and ssh runs with StrictHostKeyChecking=
yes against that file on both hops, so an instance that moved to another host is reached with
no new key to accept.

Straight to a host's gateway, the console reports the fingerprint of its key: the first
connection reads the key (`ssh-keyscan`), keeps it only if it has that fingerprint, and writes
it to the CLI's known_hosts. A gateway that later presents another key is refused by ssh; a
pinned key is replaced only when the console reports the new one."""

import base64
import hashlib
import os
import shlex
import subprocess
import sys
from pathlib import Path

from cli.errors import CliError

SCAN_TIMEOUT_SECONDS = 10


def key_fingerprint(blob: str) -> str:
    """OpenSSH's SHA256 fingerprint of a public key's base64 blob."""
    digest = hashlib.sha256(base64.b64decode(blob)).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def host_pattern(host: str, port: int) -> str:
    """How known_hosts names a host at a port."""
    return host if port == 22 else f"[{host}]:{port}"


def _keys(lines: list[str], pattern: str) -> list[tuple[str, str]]:
    """The (type, blob) pairs that known_hosts-format `lines` give for `pattern`."""
    keys = []
    for line in lines:
        fields = line.split()
        if len(fields) >= 3 and not line.startswith("#") and pattern in fields[0].split(","):
            keys.append((fields[1], fields[2]))
    return keys


def scan(host: str, port: int) -> list[tuple[str, str]]:
    """The keys the SSH server at host:port presents."""
    try:
        result = subprocess.run(
            ["ssh-keyscan", "-p", str(port), "-T", str(SCAN_TIMEOUT_SECONDS), host],
            capture_output=True, text=True, timeout=SCAN_TIMEOUT_SECONDS + 5,
        )  # fmt: skip
    except FileNotFoundError:
        raise CliError("cannot run ssh-keyscan: install an OpenSSH client") from None
    except subprocess.TimeoutExpired:
        return []
    return _keys(result.stdout.splitlines(), host_pattern(host, port))


def _marker_and_pattern(line: str) -> tuple[str, str]:
    """What a known_hosts line is for: (`@cert-authority` or "", its host pattern)."""
    fields = line.split()
    if fields and fields[0].startswith("@"):
        return fields[0], fields[1] if len(fields) > 1 else ""
    return "", fields[0] if fields else ""


def write_known_hosts(given: list[str], known_hosts: Path) -> None:
    """Make `known_hosts` hold the lines the console gives, in place of any it held for the same
    host patterns (a key or CA the console replaced)."""
    lines = known_hosts.read_text().splitlines() if known_hosts.exists() else []
    if all(line in lines for line in given):
        return
    replaced = {_marker_and_pattern(line) for line in given}
    kept = [line for line in lines if _marker_and_pattern(line) not in replaced]
    _write(known_hosts, [*kept, *given])


def _write(known_hosts: Path, lines: list[str]) -> None:
    known_hosts.parent.mkdir(parents=True, exist_ok=True)
    partial = known_hosts.with_name(known_hosts.name + ".new")
    partial.write_text("".join(f"{line}\n" for line in lines))
    partial.chmod(0o600)
    partial.replace(known_hosts)


def pin_host_key(target: dict, known_hosts: Path) -> None:
    """Make `known_hosts` hold what checks whom ssh reaches: the console's lines through the
    front, else the gateway's key with the fingerprint the console reports."""
    if target.get("proxy_jump"):
        write_known_hosts(target["known_hosts"], known_hosts)
        return
    host, port = target["host"], target["port"]
    expected = target.get("host_key_fingerprint")
    pattern = host_pattern(host, port)
    if not expected:
        raise CliError(
            f"the console reports no host key for {pattern}: cannot check whom ssh reaches"
        )
    lines = known_hosts.read_text().splitlines() if known_hosts.exists() else []
    pinned = _keys(lines, pattern)
    if any(key_fingerprint(blob) == expected for _, blob in pinned):
        return
    presented = scan(host, port)
    matching = [key for key in presented if key_fingerprint(key[1]) == expected]
    if not matching:
        shown = ", ".join(key_fingerprint(blob) for _, blob in presented) or "no key"
        raise CliError(
            f"{pattern} presents {shown}, not the host key the console reports ({expected}): "
            "not connecting (someone may be in between, or the host got a new key the console "
            "does not know yet)"
        )
    kept = [line for line in lines if not _keys([line], pattern)]
    key_type, blob = matching[0]
    _write(known_hosts, [*kept, f"{pattern} {key_type} {blob}"])
    if pinned:
        print(
            f"gpucloud: the host key of {pattern} changed to {expected}, as the console "
            f"reports; pinned in {known_hosts}",
            file=sys.stderr,
        )


def ssh_argv(
    target: dict, known_hosts: Path, identity: str | None, options: list[str], remote: list[str]
) -> list[str]:
    """The ssh command line: the user's options first (ssh keeps the first value it is given
    for an option), then the pinned known_hosts, then the target and the remote command.
    Through the front, the jump is a ProxyCommand with the same identity and known_hosts (ssh's
    -J would check the front against the user's own known_hosts)."""
    pinned = ["-o", f"UserKnownHostsFile={known_hosts}", "-o", "StrictHostKeyChecking=yes"]
    chosen = ["-i", identity] if identity else []
    argv = ["ssh", "-p", str(target["port"]), *chosen]
    for option in options:
        argv += ["-o", option]
    if target.get("proxy_jump"):
        argv += ["-o", f"ProxyCommand={_proxy_command(target['proxy_jump'], chosen, pinned)}"]
    return [*argv, *pinned, f"{target['user']}@{target['host']}", *remote]


def _proxy_command(proxy_jump: str, chosen: list[str], pinned: list[str]) -> str:
    """`ssh -W %h:%p` to the front (`user@host[:port]`, `[v6]` too), quoted for the shell
    that ssh runs it with, `%` escaped but in ssh's own %h:%p."""
    user, _, front = proxy_jump.rpartition("@")
    host, port = front, "22"
    if not front.endswith("]") and ":" in front:
        host, _, port = front.rpartition(":")
    jump = ["ssh", *chosen, *pinned, "-p", port, "-l", user, "-W", "%h:%p", host.strip("[]")]
    quoted = " ".join(shlex.quote(arg).replace("%", "%%") for arg in jump)
    return quoted.replace("%%h:%%p", "%h:%p")


def exec_ssh(argv: list[str]) -> None:
    try:
        os.execvp("ssh", argv)  # noqa: S606 - the user's own ssh, argv without a shell
    except OSError as error:
        raise CliError(f"cannot run ssh ({error}): install an OpenSSH client") from None
