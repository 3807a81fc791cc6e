"""manage.py set_host_address HOST URL

The operator's change of where the console calls a host's agent (console/fleet/identity.py):
refused, with the reason, where no agent may be. `make run` uses it when a demo agent's port
had to change."""

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from console.fleet import identity
from console.fleet.models import Host


class Command(BaseCommand):
    help = "Change the address the console calls a host's agent at (its --advertise-url)."

    def add_arguments(self, parser):
        parser.add_argument("host", help="the host's name")
        parser.add_argument("url", help="the agent's API, e.g. http://10.0.3.7:9101")

    def handle(self, *args, host, url, **options):
        found = Host.objects.filter(name=host).first()
        if found is None:
            raise CommandError(f"No host named {host!r}.")
        try:
            found = identity.change_address(found, url, actor=None)
        except ValidationError as error:
            raise CommandError(" ".join(error.messages)) from None
        self.stdout.write(f"The console calls {found.name}'s agent at {found.address}.")
