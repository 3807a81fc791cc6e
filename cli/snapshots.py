"""`gpucloud snapshots …` (list, take, delete, schedule, restore) through /api/v1/snapshots/,
/api/v1/snapshot-schedules/ and /api/v1/snapshot-restores/, and `gpucloud shelve NAME`."""

from cli import confirm

COLUMNS = ["id", "source_name", "kind", "state", "progress", "share", "created_at"]
SCHEDULE_COLUMNS = ["id", "source_name", "every_hours", "keep", "last_run_at"]
RESTORE_COLUMNS = ["id", "snapshot", "volume_name", "host", "state", "progress"]
MIB = 1024 * 1024


def add_parser(sub) -> None:
    snapshots = sub.add_parser(
        "snapshots",
        help="snapshots of instances' disks and of volumes: list, take, delete, schedule, restore",
    )
    snapshots_sub = snapshots.add_subparsers(dest="snapshots_command", required=True)
    snapshots_sub.add_parser("list", help="your snapshots, with their progress")
    take = snapshots_sub.add_parser("take", help="snapshot an instance's disk (or a volume) now")
    _source(take)
    delete = snapshots_sub.add_parser("delete", help="delete a snapshot (billed until then)")
    delete.add_argument("id", type=int)
    delete.add_argument("-y", "--yes", action="store_true", help="do not ask first")
    schedule = snapshots_sub.add_parser(
        "schedule",
        help="snapshot an instance's disk (or a volume) every N hours, keeping the newest K",
    )
    _source(schedule)
    schedule.add_argument("--every-hours", type=int, required=True)
    schedule.add_argument("--keep", type=int, required=True)
    snapshots_sub.add_parser("schedules", help="list the snapshot schedules")
    restore = snapshots_sub.add_parser(
        "restore", help="restore a snapshot into a new volume, on any host of its region"
    )
    restore.add_argument("id", type=int)
    restore.add_argument("--name", required=True, help="the new volume's name")
    restore.add_argument("--size-gib", type=int, help="default (and at least): the snapshot's")
    restore.add_argument("--host", help="a host of its region; default: any that takes work")
    snapshots_sub.add_parser("restores", help="restores into new volumes, with their progress")
    shelve = sub.add_parser(
        "shelve",
        help="shelve a stopped instance: its disk goes to a snapshot and it holds no host; "
        "`start` restores it on any host that fits",
    )
    shelve.add_argument("id", metavar="ID|NAME")


def _source(parser) -> None:
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("instance", nargs="?", metavar="ID|NAME", help="an instance")
    what.add_argument("--volume", metavar="ID|NAME", help="a volume instead of an instance")


def _source_body(client, args, instance_id) -> dict:
    if args.volume:
        return {"volume": args.volume}
    return {"instance": instance_id(client, args.instance)}


def progress(snapshot: dict) -> str:
    if snapshot["state"] != "running":
        return snapshot["state"]
    text = f"{snapshot['percent']}% of {snapshot['bytes_total'] / MIB:.0f} MiB"
    if snapshot["eta_seconds"] is not None:
        text += f", {snapshot['eta_seconds']:.0f} s left"
    return text


def share(snapshot: dict) -> str:
    """A snapshot's share of its store as last measured (what deleting it frees, and what it
    shares); one of the shared store of before the split: the data it added there."""
    if snapshot.get("bytes_unique") is not None:
        unique, shared = snapshot["bytes_unique"] / MIB, snapshot["bytes_shared"] / MIB
        return f"{unique:.1f} MiB unique, {shared:.1f} MiB shared"
    return f"{snapshot['bytes_stored'] / MIB:.1f} MiB added" if snapshot["bytes_stored"] else ""


def rows(jobs: list[dict]) -> list[dict]:
    """Snapshots or restores, with their progress (and a snapshot's share of its store)."""
    return [
        {**job, "progress": progress(job)}
        | ({"share": share(job)} if "bytes_stored" in job else {})
        for job in jobs
    ]


def run(client, args, table, instance_id) -> tuple[object, str]:
    if args.command == "shelve":
        shelf = client.call("POST", f"instances/{instance_id(client, args.id)}/shelve/")
        return shelf, (
            f"Shelving instance {shelf['instance']} (snapshot {shelf['snapshot']}): "
            "`gpucloud start` restores it on any host that fits."
        )
    command = args.snapshots_command
    if command == "list":
        snapshots = client.all("snapshots/")
        return snapshots, table(rows(snapshots), COLUMNS)
    if command == "take":
        body = _source_body(client, args, instance_id)
        snapshot = client.call("POST", "snapshots/", json=body)
        return snapshot, table(rows([snapshot]), COLUMNS)
    if command == "schedule":
        body = {
            **_source_body(client, args, instance_id),
            "every_hours": args.every_hours,
            "keep": args.keep,
        }
        schedule = client.call("POST", "snapshot-schedules/", json=body)
        return schedule, table([schedule], SCHEDULE_COLUMNS)
    if command == "schedules":
        schedules = client.all("snapshot-schedules/")
        return schedules, table(schedules, SCHEDULE_COLUMNS)
    if command == "restore":
        body = {"name": args.name}
        body |= {"size_gib": args.size_gib} if args.size_gib else {}
        body |= {"host": args.host} if args.host else {}
        restore = client.call("POST", f"snapshots/{args.id}/restore/", json=body)
        return restore, table(rows([restore]), RESTORE_COLUMNS)
    if command == "restores":
        restores = client.all("snapshot-restores/")
        return restores, table(rows(restores), RESTORE_COLUMNS)
    confirm.confirm(f"Delete snapshot {args.id}? Its data is deleted for good.", args.yes)
    client.call("DELETE", f"snapshots/{args.id}/")
    return {"deleted": args.id}, f"Deleted snapshot {args.id}."
