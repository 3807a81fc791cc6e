"""`gpucloud volumes …`: list, create (its price shown), attach, detach and delete volumes
through /api/v1/volumes/, and the launch's `--volume NAME[:PATH]`."""

from cli import confirm, integers
from cli.errors import CliError

COLUMNS = ["id", "name", "size_gib", "region", "state", "host", "instance", "mount_path", "price"]


def add_parser(sub) -> None:
    volumes = sub.add_parser("volumes", help="volumes: list, create, attach, detach, delete")
    volumes_sub = volumes.add_subparsers(dest="volumes_command", required=True)
    volumes_sub.add_parser("list", help="your volumes")
    create = volumes_sub.add_parser("create", help="a new volume (billed until deleted)")
    create.add_argument("name")
    create.add_argument("--size-gib", type=int, required=True)
    create.add_argument("--region", help="a region's code (default: the first region)")
    attach = volumes_sub.add_parser("attach", help="attach a volume to a stopped instance")
    attach.add_argument("volume", metavar="ID|NAME")
    attach.add_argument("instance", metavar="INSTANCE_ID")
    attach.add_argument("--mount-path", help="where the container sees it (default: /mnt/NAME)")
    detach = volumes_sub.add_parser("detach", help="detach a volume from its stopped instance")
    detach.add_argument("volume", metavar="ID|NAME")
    delete = volumes_sub.add_parser("delete", help="delete a volume and its data for good")
    delete.add_argument("volume", metavar="ID|NAME")
    delete.add_argument("-y", "--yes", action="store_true", help="do not ask first")


def parse_mount(item: str) -> dict:
    """`--volume NAME[:PATH]` of a launch."""
    name, _, path = item.partition(":")
    return {"volume": name, **({"mount_path": path} if path else {})}


def volume_id(client, ref: str) -> int:
    if (pk := integers.whole(ref)) is not None:
        return pk
    found = [row for row in client.all("volumes/") if row["name"] == ref]
    if not found:
        raise CliError(f"no volume named {ref}")
    return found[0]["id"]


def rows(volumes: list[dict]) -> list[dict]:
    return [{**v, "price": f"{v['price_per_month']}/month"} for v in volumes]


def run(client, args, table, instance_id) -> tuple[object, str]:
    command = args.volumes_command
    if command == "list":
        volumes = client.all("volumes/")
        return volumes, table(rows(volumes), COLUMNS)
    if command == "create":
        body = {"name": args.name, "size_gib": args.size_gib}
        params = {"size_gib": args.size_gib, **({"region": args.region} if args.region else {})}
        price = client.call("GET", "volumes/price/", params=params)
        if args.region:
            body["region"] = args.region
        volume = client.call("POST", "volumes/", json=body)
        return volume, (
            f"{table(rows([volume]), COLUMNS)}\n\nBilled {price['price_per_month']} a month "
            f"({price['price_per_gib_month']} per GiB-month) until you delete it."
        )
    pk = volume_id(client, args.volume)
    if command == "attach":
        body = {"instance": instance_id(client, args.instance)}
        if args.mount_path:
            body["mount_path"] = args.mount_path
        volume = client.call("POST", f"volumes/{pk}/attach/", json=body)
        return volume, table(rows([volume]), COLUMNS)
    if command == "detach":
        volume = client.call("POST", f"volumes/{pk}/detach/")
        return volume, table(rows([volume]), COLUMNS)
    name = client.call("GET", f"volumes/{pk}/")["name"]
    confirm.confirm(f"Delete volume {name}? Its data is deleted for good.", args.yes)
    client.call("DELETE", f"volumes/{pk}/")
    return {"deleted": pk}, f"Deleted volume {name}."
