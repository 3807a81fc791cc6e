"""`manage.py ssh_front`: the SSH front users reach every instance through
(console/instances/ssh_front.py)."""

import asyncio

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from console import integers
from console.fleet import ssh_authority
from console.instances import ssh_front


class Command(BaseCommand):
    help = "Run the SSH front: `ssh -J ID@FRONT ID@gpucloud` reaches instance ID wherever it runs."

    def add_arguments(self, parser):
        parser.add_argument(
            "--listen",
            metavar="HOST:PORT",
            help="where to listen (default: SSH_FRONT, the address users are told)",
        )

    def handle(self, *args, listen=None, **options):
        if not (listen or settings.SSH_FRONT):
            raise CommandError("Set SSH_FRONT (the host:port users reach) or give --listen.")
        host, _, port = (listen or "").rpartition(":")
        try:
            port = integers.parse(port, maximum=65535) if listen else None
        except integers.NotAWholeNumber:
            raise CommandError(f"--listen must be HOST:PORT, not {listen!r}") from None
        host, port = (host.strip("[]"), port) if listen else ssh_authority.front_address()
        try:
            asyncio.run(ssh_front.serve(host, port))
        except KeyboardInterrupt:
            pass
        except OSError as exc:
            raise CommandError(f"cannot listen on {host}:{port}: {exc}") from exc
