"""`gpucloud registry-credentials …`: list, add (or replace) and remove the tenant's private
registry credentials through /api/v1/registry-credentials/. The token is read from stdin or
asked for without echo, never taken as an argument (it would stay in the shell's history and
in `ps`)."""

import getpass
import sys

from cli.errors import CliError

COLUMNS = ["id", "registry", "username", "created_at", "last_used_at"]


def add_parser(sub) -> None:
    creds = sub.add_parser(
        "registry-credentials", help="private registries' credentials: list, add, remove"
    )
    creds_sub = creds.add_subparsers(dest="registry_command", required=True)
    creds_sub.add_parser("list", help="the tenant's credentials (never their tokens)")
    add = creds_sub.add_parser(
        "add",
        help="add one (or replace a registry's): the token is read from stdin, or asked for",
    )
    add.add_argument("registry", help="host[:port], e.g. ghcr.io")
    add.add_argument("username")
    creds_sub.add_parser("remove", help="remove a registry's credential").add_argument("registry")


def read_secret(stdin=None, ask=getpass.getpass) -> str:
    """The token: the first line of stdin when it is not a terminal, else asked for."""
    stdin = stdin or sys.stdin
    secret = ask("Token or password: ") if stdin.isatty() else stdin.readline()
    secret = secret.rstrip("\r\n")
    if not secret:
        raise CliError("no token given: pipe it on stdin, or type it when asked")
    return secret


def run(client, args, table) -> tuple[object, str]:
    """The command; `table` is cli.main's table printer."""
    if args.registry_command == "list":
        rows = client.all("registry-credentials/")
        return rows, table(rows, COLUMNS)
    if args.registry_command == "add":
        body = {"registry": args.registry, "username": args.username, "password": read_secret()}
        saved = client.call("POST", "registry-credentials/", json=body)
        return saved, f"Saved the credential for {saved['registry']} ({saved['username']})."
    found = [
        row
        for row in client.all("registry-credentials/")
        if row["registry"] == args.registry.lower()
    ]
    if not found:
        raise CliError(f"no credential for {args.registry}")
    client.call("DELETE", f"registry-credentials/{found[0]['id']}/")
    return None, f"Removed the credential for {found[0]['registry']}."
