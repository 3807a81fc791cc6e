"""`manage.py stop_instances`: what `make run` does on Ctrl-C before its processes exit."""

import time

from django.core.management.base import BaseCommand

from console.instances import lifecycle, services
from console.instances.models import Instance, State

# Instances that are on a host, on their way to one, or queued for one.
UNSETTLED = lifecycle.ON_HOST | {State.PENDING}


class Command(BaseCommand):
    help = (
        "Stop every instance through the normal path (the worker asks each one's agent, so "
        "its container goes and its GPU time is closed), queued ones at once; wait until "
        "none is left on a host or on its way, at most --wait seconds."
    )

    def add_arguments(self, parser):
        parser.add_argument("--wait", type=float, default=60.0, help="seconds (default 60)")

    def handle(self, *args, wait: float, **options):
        deadline = time.monotonic() + wait
        asked = set()
        while True:
            for instance in Instance.objects.filter(state__in=lifecycle.ACTIONS["stop"]):
                try:
                    services.stop_instance(instance)
                except services.InvalidState:
                    continue  # it moved meanwhile: seen again on the next round
                asked.add(instance.pk)
            left = list(Instance.objects.filter(state__in=UNSETTLED).values_list("name", "state"))
            if not left:
                break
            if time.monotonic() > deadline:
                names = ", ".join(f"{name} ({state})" for name, state in left)
                self.stderr.write(f"still not stopped after {wait:g}s: {names}")
                break
            time.sleep(0.5)
        self.stdout.write(f"{len(asked)} instance(s) stopped")
