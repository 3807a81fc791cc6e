"""`gpucloud`: the command-line client of the REST API.

Configuration: `gpucloud login --url URL --token TOKEN` writes ~/.config/gpucloud/config.json;
GPUCLOUD_URL and GPUCLOUD_TOKEN override it. Every command prints a table, or JSON with --json.
"""

import argparse
import json
import os
import shlex
import sys
import time
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import httpx

from cli import confirm, integers, registry_credentials, snapshots, tokens, volumes
from cli.errors import CliError
from cli.ssh import exec_ssh, pin_host_key, ssh_argv
from cli.wait import human_size, wait_until_running


def config_path() -> Path:
    default = Path.home() / ".config" / "gpucloud" / "config.json"
    return Path(os.environ.get("GPUCLOUD_CONFIG", default))


def load_config() -> dict:
    path = config_path()
    try:
        config = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError) as error:
        raise CliError(f"cannot read {path} ({error}): run `gpucloud login` again") from None
    if not isinstance(config, dict):
        raise CliError(f"{path} is not a gpucloud config: run `gpucloud login` again")
    config["url"] = os.environ.get("GPUCLOUD_URL") or config.get("url") or "http://127.0.0.1:8000"
    config["token"] = os.environ.get("GPUCLOUD_TOKEN") or config.get("token")
    return config


class Client:
    def __init__(self, url: str, token: str | None):
        if not token:
            raise CliError("No API token: run `gpucloud login --token …` or set GPUCLOUD_TOKEN.")
        self.http = httpx.Client(
            base_url=url.rstrip("/") + "/api/v1/",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )

    def call(self, method: str, path: str, **kwargs):
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise CliError(f"cannot reach {self.http.base_url}: {exc}") from exc
        if response.status_code >= 400:
            try:
                body = response.json()
            except ValueError:
                raise CliError(f"HTTP {response.status_code}") from None
            errors = body.get("errors", {})
            fields = "".join(
                f"\n  {field}: {' '.join(map(str, msgs))}" for field, msgs in errors.items()
            )
            raise CliError(
                f"{body.get('detail', 'error')} ({body.get('code')}){fields}",
                errors,
                code=body.get("code"),
            )
        return response.json() if response.content else None

    def all(self, path: str, **params) -> list[dict]:
        results, offset = [], 0
        while True:
            page = self.call("GET", path, params={**params, "limit": 200, "offset": offset})
            results += page["results"]
            offset += len(page["results"])
            if not page.get("next") or not page["results"]:
                return results


def money(amount: str, currency: str, places: int = 2) -> str:
    """The console's money format (billing.money.format_money): charged amounts in cents,
    rated ones (lines, prices, rates) at 6 places, with the currency: 1,234.50 USD."""
    value = Decimal(amount).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)
    return f"{value + 0:,.{places}f} {currency}"


def table(rows: list[dict], columns: list[str]) -> str:
    if not rows:
        return "(none)"
    cells = [[str("" if row.get(c) is None else row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def first_region(client) -> str | None:
    """The code of the first region, the default of --region."""
    regions = client.all("regions/")
    return regions[0]["code"] if regions else None


def image_cells(row: dict) -> dict:
    """An image's availability and size, as the images table shows them."""
    found = row.get("availability") or {}
    size = found.get("size_bytes")
    return {"availability": found.get("status", ""), "size": human_size(size) if size else ""}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpucloud", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sub = parser.add_subparsers(dest="command", required=True)
    login = sub.add_parser("login", help="save the console URL and an API token")
    login.add_argument("--url", default="http://127.0.0.1:8000")
    login.add_argument("--token", required=True)
    specs = sub.add_parser("specs", help="what you can launch, and whether it fits in a region")
    specs.add_argument("--region", help="a region's code (default: the first region)")
    images = sub.add_parser("images", help="images to boot, and whether a region can run each")
    images.add_argument("--region", help="a region's code (default: the first region)")
    sub.add_parser("quota", help="your limits and what you use")
    instances = sub.add_parser("instances", help="list instances (but terminated ones)")
    instances.add_argument("--state", help="only these states, comma-separated")
    instances.add_argument("--all", action="store_true", help="terminated ones too")
    launch = sub.add_parser("launch", help="launch an instance")
    launch.add_argument(
        "name", nargs="?", help="default: a generated one, such as a100-quarter-brave-otter"
    )
    launch.add_argument(
        "--template", metavar="NAME|ID",
        help="launch a template (see `gpucloud templates list`); the other options override it",
    )  # fmt: skip
    launch.add_argument(
        "--spec", help="a spec's code (see `gpucloud specs`); required without --template"
    )
    launch.add_argument("--image", help="an image's name (default: the first, as in the console)")
    launch.add_argument(
        "--image-ref", metavar="REFERENCE",
        help="an image of your own instead of --image, e.g. ghcr.io/team/trainer:1.0 (pinned to "
        "its digest at the first pull; a private registry's credential: registry-credentials add)",
    )  # fmt: skip
    launch.add_argument(
        "--disk-gib", type=int, help="its disk at /workspace (default and smallest: the spec's)"
    )
    launch.add_argument("--region")
    launch.add_argument(
        "--command", dest="run", metavar="COMMAND",
        help="what to run instead of the image's default, e.g. 'python train.py --epochs 3'",
    )  # fmt: skip
    launch.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE",
        help="an environment variable (repeat for more)",
    )  # fmt: skip
    launch.add_argument(
        "--secret", action="append", default=[], dest="secrets", metavar="NAME[=VALUE]",
        help="a secret environment variable, stored encrypted and never shown again; without "
        "=VALUE, the value of NAME in this environment (kept out of your shell history)",
    )  # fmt: skip
    launch.add_argument(
        "--ssh-key", action="append", dest="ssh_keys", metavar="NAME",
        help="an SSH key that opens its shells (repeat for more; default: all of yours)",
    )  # fmt: skip
    launch.add_argument(
        "--port", action="append", default=[], dest="ports", metavar="PORT:NAME",
        help="a web port to open through the console, e.g. 8080:app (repeat for more)",
    )  # fmt: skip
    launch.add_argument(
        "--volume", action="append", default=[], dest="volumes", metavar="NAME[:PATH]",
        help="attach a volume of yours, e.g. data:/data (repeat for more; see `gpucloud volumes`)",
    )  # fmt: skip
    launch.add_argument(
        "--restart", choices=("never", "on-failure", "always"),
        help="whether it runs again after a failure, such as its host lost (default: its image's)",
    )  # fmt: skip
    launch.add_argument(
        "--on-host-loss", choices=("keep_disk", "fresh_disk"),
        help="if its host is lost: keep_disk (wait for the host, which holds its disk; default) "
        "or fresh_disk (run again elsewhere on a new, empty disk)",
    )  # fmt: skip
    launch.add_argument(
        "--wait", action="store_true",
        help="wait until it runs (exit 0) or fails (exit 1, with the reason), printing its states",
    )  # fmt: skip
    launch.add_argument(
        "--timeout", type=float, default=600, metavar="SECONDS",
        help="with --wait: give up waiting (exit 1) after this long (default 600)",
    )  # fmt: skip
    templates = sub.add_parser("templates", help="saved launches: yours and the published ones")
    templates_sub = templates.add_subparsers(dest="templates_command", required=True)
    templates_sub.add_parser("list", help="list the templates you can launch")
    save = templates_sub.add_parser("save", help="save what an instance was launched with")
    save.add_argument("id", metavar="ID|NAME", help="the instance")
    save.add_argument("name", help="the template's name")
    templates_sub.add_parser("delete", help="delete one of your templates").add_argument(
        "template", metavar="NAME|ID"
    )
    keys = sub.add_parser("ssh-keys", help="your SSH keys in this tenant")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    keys_sub.add_parser("list", help="list your keys")
    add = keys_sub.add_parser("add", help="add a public key")
    add.add_argument("name")
    add.add_argument("file", help="the public key file, e.g. ~/.ssh/id_ed25519.pub")
    keys_sub.add_parser("delete", help="delete a key").add_argument("name")
    ssh = sub.add_parser("ssh", help="ssh into a running instance (runs the system ssh)")
    ssh.add_argument("id", metavar="ID|NAME")
    ssh.add_argument("-i", dest="identity", metavar="IDENTITY", help="the private key to use")
    ssh.add_argument(
        "-o", dest="ssh_options", action="append", default=[], metavar="OPTION",
        help="an ssh option, e.g. -o ServerAliveInterval=30 (repeat for more)",
    )  # fmt: skip
    ssh.add_argument("remote", nargs="*", help="-- COMMAND to run instead of a shell")
    logs = sub.add_parser("logs", help="what an instance's workload printed")
    logs.add_argument("id", metavar="ID|NAME")
    logs.add_argument("--tail", type=int, default=100, help="how many last lines (default 100)")
    logs.add_argument(
        "-f", "--follow", action="store_true", help="keep printing new lines while it runs"
    )
    show = sub.add_parser("show", help="one instance: how to reach it, and its events")
    show.add_argument("id", metavar="ID|NAME")
    yes_help = "do not ask first (needed without a terminal to ask on)"
    for action in ("stop", "start", "reboot", "terminate"):
        acting = sub.add_parser(action, help=f"{action} an instance")
        acting.add_argument("id", metavar="ID|NAME")
        if action in confirm.QUESTIONS:
            acting.add_argument("-y", "--yes", action="store_true", help=yes_help)
        if action == "terminate":
            acting.add_argument(
                "--keep-disk", action="store_true", help="keep its disk as a volume of yours"
            )
    resize = sub.add_parser(
        "resize",
        help="move an instance to another spec (live when only vCPUs and RAM change; asks "
        "first when it restarts or stops it)",
    )
    resize.add_argument("id", metavar="ID|NAME")
    resize.add_argument("-y", "--yes", action="store_true", help=yes_help)
    resize.add_argument("--spec", required=True)
    resize.add_argument(
        "--disk-gib", type=int, help="a bigger disk (default: it stays as it is; never shrinks)"
    )
    usage = sub.add_parser("usage", help="usage and cost of a month")
    usage.add_argument("--month", help="YYYY-MM (default: this month)")
    sub.add_parser("invoices", help="your invoices")
    tokens.add_parser(sub)
    registry_credentials.add_parser(sub)
    volumes.add_parser(sub)
    snapshots.add_parser(sub)
    return parser


INSTANCE_COLUMNS = ["id", "name", "state", "spec", "image", "region", "reason"]


def instances_table(rows: list[dict]) -> str:
    """Instances as a table; REASON says why each is in its state in words (the API's
    reason_text; its state_reason from a console older than that field)."""
    shown = [{**row, "reason": row.get("reason_text", row.get("state_reason"))} for row in rows]
    return table(shown, INSTANCE_COLUMNS)


SPEC_COLUMNS = ["code", "mode", "gpu_model", "gpu_count", "mig_profile", "gpu_equivalents",
                "gpu_memory_mib", "vcpus", "ram_mib", "price_per_hour"]  # fmt: skip


def instance_id(client: "Client", ref: str) -> int:
    """An instance's id from an id or a name (unique in the tenant among live instances;
    all digits reads as an id)."""
    if (pk := integers.whole(ref)) is not None:
        return pk
    live = [i for i in client.all("instances/", name=ref) if i["state"] != "terminated"]
    if not live:
        raise CliError(f"no live instance named {ref!r}: see `gpucloud instances`")
    return live[0]["id"]


def describe(instance: dict) -> str:
    """What it runs (an argv, quoted to paste back into a shell), and how to reach it: its ssh
    command and its web ports' URLs."""
    lines = []
    if instance.get("image_digest"):
        lines.append(f"image: {instance['image_reference']} pinned to {instance['image_digest']}")
    if instance.get("command"):
        lines.append(f"command: {shlex.join(instance['command'])}")
    if instance.get("ssh"):
        lines.append(f"ssh: {instance['ssh']['command']}")
        lines.append(f"ssh host key: {instance['ssh']['host_key_fingerprint']}")
        if instance["ssh"].get("proxy_jump"):
            lines += [f"ssh known_hosts: {line}" for line in instance["ssh"]["known_hosts"]]
    for port in instance.get("ports") or []:
        lines.append(f"{port['name']} (port {port['port']}): {port['url']}")
        if port.get("origin_url"):
            lines.append(f"  with an API token: {port['origin_url']}")
    if instance.get("disk"):
        lines.append(f"disk: {instance['disk']['size_gib']} GiB")
    return "\n".join(lines)


def event_rows(events: list[dict]) -> list[dict]:
    """Events as a table shows them: a note (no change of state) says so."""
    return [
        {**e, "change": "note" if e.get("kind") == "note" else
         f"{e['from_state'] or '∅'} → {e['to_state']}"}
        for e in events
    ]  # fmt: skip


def run(args, config: dict) -> tuple[object, str]:
    """Do the command; return what to print as JSON and as text."""
    if args.command == "login":
        try:
            Client(args.url, args.token).call("GET", "quota/")
        except CliError as error:
            if error.code != "scope_missing":  # a scoped token is a good one all the same
                raise
        path = config_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"url": args.url, "token": args.token}))
        path.chmod(0o600)
        return {"url": args.url}, f"Logged in to {args.url}."
    client = Client(config["url"], config["token"])
    if args.command == "specs":
        region = args.region or first_region(client)
        rows = client.all("specs/", **({"region": region} if region else {}))
        shown = [
            {**row, "availability": (row.get("availability") or {}).get("status", "")}
            for row in rows
        ]
        text = table(shown, [*SPEC_COLUMNS, "availability"])
        if region:
            text = f"In {region}: fits_now, queues (busy), no_hardware or over_quota\n\n{text}"
        return rows, text
    if args.command == "images":
        region = args.region or first_region(client)
        rows = client.all("images/", **({"region": region} if region else {}))
        shown = [{**row, **image_cells(row)} for row in rows]
        text = table(shown, ["name", "cuda_version", "size", "availability", "description"])
        if region:
            text = (
                f"In {region}: held (on its hosts), mirror, registry (pulled), unreachable or "
                f"not_built; `--json` says why\n\n{text}"
            )
        return rows, text
    if args.command == "quota":
        quota = client.call("GET", "quota/")
        return quota, "\n".join(f"{k}: {v}" for k, v in quota.items())
    if args.command == "instances":
        rows = client.all("instances/", **({"state": args.state} if args.state else {}))
        if not args.all and not args.state:
            rows = [row for row in rows if row["state"] != "terminated"]
        return rows, instances_table(rows)
    if args.command == "launch":
        # what is not given, the template or the API chooses: a generated name, the default image
        if args.spec is None and args.template is None:
            raise CliError("give --spec, or --template")
        body = {}
        given = (("template", args.template), ("spec", args.spec), ("name", args.name),
                 ("image", args.image), ("image_ref", args.image_ref),
                 ("disk_gib", args.disk_gib))  # fmt: skip
        for key, value in given:
            if value is not None:
                body[key] = value
        if args.region:
            body["region"] = args.region
        if args.run:
            try:
                body["command"] = shlex.split(args.run)
            except ValueError as error:
                raise CliError(f"cannot split --command: {error}") from None
        if args.env:
            body["env"] = dict(parse_env(item) for item in args.env)
        if args.secrets:
            body["secret_env"] = dict(parse_secret(item) for item in args.secrets)
        if args.ssh_keys:
            body["ssh_keys"] = args.ssh_keys
        if args.ports:
            body["ports"] = [parse_port(item) for item in args.ports]
        if args.volumes:
            body["volumes"] = [volumes.parse_mount(item) for item in args.volumes]
        if args.restart:
            body["restart_policy"] = args.restart
        if args.on_host_loss:
            body["on_host_loss"] = args.on_host_loss
        instance = client.call("POST", "instances/", json=body)
        if args.wait:
            instance = wait_until_running(client, instance, args.timeout)
        return instance, instances_table([instance])
    if args.command == "ssh-keys":
        return ssh_keys(client, args)
    if args.command == "templates":
        return templates(client, args)
    if args.command == "ssh":
        instance = client.call("GET", f"instances/{instance_id(client, args.id)}/")
        target = instance.get("ssh")
        if target is None:
            raise CliError(
                f"instance {args.id} is {instance['state']}: ssh needs it running, on a host "
                "with an SSH gateway, and your role member or above"
            )
        known_hosts = config_path().parent / "known_hosts"
        pin_host_key(target, known_hosts)
        exec_ssh(ssh_argv(target, known_hosts, args.identity, args.ssh_options, args.remote))
    if args.command == "logs":
        pk = instance_id(client, args.id)
        if args.follow:
            follow_logs(client, pk, args.tail)
            return None, ""
        logs = client.call("GET", f"instances/{pk}/logs/", params={"tail": args.tail})
        return logs, "\n".join(logs["lines"])
    if args.command == "show":
        pk = instance_id(client, args.id)
        instance = client.call("GET", f"instances/{pk}/")
        events = client.all(f"instances/{pk}/events/")
        parts = [instances_table([instance]), describe(instance)]
        parts.append(table(event_rows(events), ["at", "change", "actor", "message"]))
        return {**instance, "events": events}, "\n\n".join(part for part in parts if part)
    if args.command in ("stop", "start", "reboot", "terminate"):
        pk = instance_id(client, args.id)
        if args.command in confirm.QUESTIONS:
            name = client.call("GET", f"instances/{pk}/")["name"]  # one that exists, by name
            confirm.confirm(confirm.QUESTIONS[args.command].format(ref=name), args.yes)
        body = {"keep_disk": True} if getattr(args, "keep_disk", False) else None
        instance = client.call("POST", f"instances/{pk}/{args.command}/", json=body)
        return instance, instances_table([instance])
    if args.command == "resize":
        body = {"spec": args.spec}
        if args.disk_gib is not None:
            body["disk_gib"] = args.disk_gib
        instance = confirm.resize(client, instance_id(client, args.id), body, args.yes)
        return instance, instances_table([instance])
    if args.command == "usage":
        usage = client.call("GET", "usage/", params={"month": args.month} if args.month else {})
        currency = usage["currency"]
        lines = [
            {
                **line,
                "instance": line["instance"]["name"],
                "price_per_hour": money(line["price_per_hour"], currency, 6),
                "amount": money(line["amount"], currency, 6),
            }
            for line in usage["lines"]
        ]
        text = table(lines, ["instance", "kind", "spec", "seconds", "price_per_hour", "amount"])
        forecast = "-" if usage["forecast"] is None else money(usage["forecast"], currency)
        return usage, (
            f"{text}\n\ntotal {money(usage['total'], currency)} · now "
            f"{money(usage['rate_per_hour'], currency, 6)}/h · month-end forecast {forecast}"
        )
    if args.command == "tokens":
        return tokens.run(client, args, table)
    if args.command == "registry-credentials":
        return registry_credentials.run(client, args, table)
    if args.command == "volumes":
        return volumes.run(client, args, table, instance_id)
    if args.command in ("snapshots", "shelve"):
        return snapshots.run(client, args, table, instance_id)
    if args.command == "invoices":
        rows = client.all("invoices/")
        shown = [{**row, "total": money(row["total"], row["currency"])} for row in rows]
        return rows, table(shown, ["id", "number", "month", "status", "total"])
    raise CliError(f"unknown command {args.command}")


KEY_COLUMNS = ["name", "fingerprint", "created_at"]


def ssh_keys(client: Client, args) -> tuple[object, str]:
    if args.keys_command == "list":
        rows = client.all("ssh-keys/")
        return rows, table(rows, KEY_COLUMNS)
    if args.keys_command == "add":
        try:
            public_key = Path(args.file).expanduser().read_text()
        except OSError as error:
            raise CliError(f"cannot read {args.file}: {error}") from None
        key = client.call("POST", "ssh-keys/", json={"name": args.name, "public_key": public_key})
        return key, table([key], KEY_COLUMNS)
    client.call("DELETE", f"ssh-keys/{args.name}/")
    return {"deleted": args.name}, f"Deleted {args.name}."


TEMPLATE_COLUMNS = ["id", "name", "spec", "image", "public", "description"]


def templates(client: Client, args) -> tuple[object, str]:
    if args.templates_command == "list":
        rows = client.all("templates/")
        return rows, table(rows, TEMPLATE_COLUMNS)
    if args.templates_command == "save":
        path = f"instances/{instance_id(client, args.id)}/save-template/"
        template = client.call("POST", path, json={"name": args.name})
        return template, table([template], TEMPLATE_COLUMNS)
    ref = args.template
    own = [t for t in client.all("templates/") if t["mine"] and ref in (t["name"], str(t["id"]))]
    if not own:
        raise CliError(f"no template of yours named {ref!r}: see `gpucloud templates list`")
    client.call("DELETE", f"templates/{own[0]['id']}/")
    return {"deleted": own[0]["name"]}, f"Deleted {own[0]['name']}."


def parse_secret(item: str) -> tuple[str, str]:
    """NAME=VALUE, or NAME alone: its value in the CLI's own environment."""
    if "=" in item:
        return parse_env(item)
    if item not in os.environ:
        raise CliError(f"--secret {item}: write NAME=VALUE, or set {item} in the environment")
    return item, os.environ[item]


def parse_port(item: str) -> dict:
    port, colon, name = item.partition(":")
    number = integers.whole(port, maximum=65535)
    if not colon or number is None or not name:
        raise CliError(f"--port {item!r}: write PORT:NAME, e.g. 8080:app")
    return {"port": number, "name": name}


def parse_env(item: str) -> tuple[str, str]:
    name, equals, value = item.partition("=")
    if not equals:
        raise CliError(f"--env {item!r}: write NAME=VALUE")
    return name, value


FOLLOW_SECONDS = 2.0
ENDED = ("stopped", "failed", "terminated")


def new_lines(seen: list[str], lines: list[str]) -> list[str]:
    """The lines of `lines` (a later tail of the same log) that come after `seen`: after the
    longest end of `seen` that `lines` starts with."""
    for overlap in range(min(len(seen), len(lines)), 0, -1):
        if seen[-overlap:] == lines[:overlap]:
            return lines[overlap:]
    return lines


def follow_logs(client: Client, instance_id: int, tail: int) -> None:
    """Print the last lines, then the new ones every 2 s until the workload has ended (or
    Ctrl-C)."""
    seen: list[str] = []
    try:
        while True:
            logs = client.call("GET", f"instances/{instance_id}/logs/", params={"tail": tail})
            fresh = new_lines(seen, logs["lines"])
            if fresh:
                print("\n".join(fresh), flush=True)
            seen = (seen + fresh)[-max(tail, 1) :]
            state = client.call("GET", f"instances/{instance_id}/")["state"]
            if state in ENDED:
                return
            time.sleep(FOLLOW_SECONDS)
    except KeyboardInterrupt:
        return


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line; for `ssh`, what follows the first `--` is the remote command
    (argparse would not take it after an option: `ssh NAME -o X=y -- cmd`)."""
    parser = build_parser()
    command = next((arg for arg in argv if not arg.startswith("-")), None)  # after --json
    if command == "ssh" and "--" in argv:
        split = argv.index("--")
        args = parser.parse_args(argv[:split])
        args.remote += argv[split + 1 :]
        return args
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        as_json, as_text = run(args, load_config())
        if as_json is not None or as_text:
            print(json.dumps(as_json, indent=2) if args.json else as_text)
        sys.stdout.flush()
    except CliError as error:
        print(f"gpucloud: {error}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (`gpucloud instances | head`): stop quietly, as a tool killed
        # by SIGPIPE would, and keep Python's flush at exit from raising again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return 0


if __name__ == "__main__":
    sys.exit(main())
