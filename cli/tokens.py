"""`gpucloud tokens …`: list, create (scoped, confined to a name prefix, expiring) and revoke
API tokens through /api/v1/tokens/."""

import re
from datetime import UTC, datetime, timedelta

from cli.errors import CliError

COLUMNS = ["id", "name", "prefix", "user", "access", "instances", "expires", "state"]
_DURATION = re.compile(r"([0-9]{1,5})([hdw])")
_UNITS = {"h": "hours", "d": "days", "w": "weeks"}


def add_parser(sub) -> None:
    tokens = sub.add_parser("tokens", help="API tokens: list, create (scoped), revoke")
    tokens_sub = tokens.add_subparsers(dest="tokens_command", required=True)
    tokens_sub.add_parser("list", help="tokens you can see (an admin's: everyone's)")
    create = tokens_sub.add_parser("create", help="a new token for you; its secret is printed once")
    create.add_argument("name")
    create.add_argument(
        "--scope", action="append", dest="scopes", metavar="SCOPE",
        help="what it may do, e.g. instances:read, instances:stop, metrics:read, instances:* "
        "(repeat for more; default: whatever your role allows)",
    )  # fmt: skip
    create.add_argument(
        "--prefix", default="", metavar="PREFIX",
        help="it sees, acts on and launches only instances whose name starts with this",
    )  # fmt: skip
    create.add_argument(
        "--expires", metavar="WHEN",
        help="30d, 12h, 2w, or a date (YYYY-MM-DD, UTC) or ISO time (default: never)",
    )  # fmt: skip
    create.add_argument("--read-only", action="store_true", help="it reads only (a viewer)")
    tokens_sub.add_parser("revoke", help="revoke a token (and those it created)").add_argument(
        "id", type=int
    )


def expiry(text: str, now: datetime | None = None) -> str:
    """An ISO time from --expires: a duration from now (30d, 12h, 2w) or a date or time."""
    now = now or datetime.now(UTC)
    duration = _DURATION.fullmatch(text.strip())
    if duration:
        return (now + timedelta(**{_UNITS[duration[2]]: int(duration[1])})).isoformat()
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise CliError(
            f"--expires {text!r}: write a duration (30d, 12h, 2w) or a date (YYYY-MM-DD)"
        ) from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).isoformat()


def shown(token: dict) -> dict:
    access = "read only" if token["read_only"] else "read & write"
    if token["scopes"] is not None:
        access = " ".join(token["scopes"]) + (" (read only)" if token["read_only"] else "")
    return {
        **token,
        "access": access,
        "instances": f"{token['instance_prefix']}*" if token["instance_prefix"] else "all",
        "expires": token["expires_at"] or "never",
    }


def run(client, args, table) -> tuple[object, str]:
    """The command; `table` is cli.main's table printer."""
    if args.tokens_command == "list":
        rows = client.all("tokens/")
        return rows, table([shown(row) for row in rows], COLUMNS)
    if args.tokens_command == "create":
        body = {"name": args.name, "instance_prefix": args.prefix, "read_only": args.read_only}
        if args.scopes:
            body["scopes"] = args.scopes
        if args.expires:
            body["expires_at"] = expiry(args.expires)
        token = client.call("POST", "tokens/", json=body)
        secret = f"The token (shown only this once):\n{token['token']}"
        return token, f"{table([shown(token)], COLUMNS)}\n\n{secret}"
    token = client.call("POST", f"tokens/{args.id}/revoke/")
    return token, f"Revoked {token['name']}."
