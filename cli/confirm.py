"""Asking before what ends an instance's processes: stop, reboot, terminate, and a resize
that restarts or stops it. `--yes` answers for the user; without a terminal to ask on, the
command refuses rather than guess."""

import sys

from cli.errors import CliError

# what each action does to the tenant's processes: the question asked
QUESTIONS = {
    "stop": "Stop {ref}? Every process in it ends and its GPU is freed; its disk stays.",
    "reboot": "Reboot {ref}? Every process in it ends and its workload starts again.",
    "terminate": "Terminate {ref}? Every process in it ends and its disk is deleted for good.",
}
# the API's flags that allow a resize to restart or stop a running instance
CONSENT_FIELDS = ("allow_restart", "allow_stop")


def confirm(question: str, yes: bool) -> None:
    """Go on when `yes`, or when the user answers y on the terminal; CliError otherwise."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise CliError(f"{question} There is no terminal to ask on: give --yes to confirm.")
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    if sys.stdin.readline().strip().lower() not in ("y", "yes"):
        raise CliError("Nothing was done.")


def resize(client, pk: int, body: dict, yes: bool) -> dict:
    """Ask the API for the resize. One it refuses for want of allow_restart or allow_stop is
    asked about (the API's sentence is the question) and sent again with that flag; `yes`
    sends both at once."""
    if yes:
        body = {**body, **dict.fromkeys(CONSENT_FIELDS, True)}
    path = f"instances/{pk}/resize/"
    try:
        return client.call("POST", path, json=body)
    except CliError as error:
        field = next((name for name in CONSENT_FIELDS if name in error.fields), None)
        if field is None or yes:
            raise
        confirm(" ".join(map(str, error.fields[field])) + " Go on?", yes=False)
        return client.call("POST", path, json={**body, field: True})
