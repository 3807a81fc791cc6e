from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from billing.demo import load_history
from console.catalog import demo


class Command(BaseCommand):
    help = (
        "Load the demo catalog, tenants and users (with published passwords, one of them "
        "staff), and acme's last two months of usage with their invoices (the older one "
        "paid). Refused with DEBUG off unless --yes-demo. Running it again changes nothing."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--yes-demo",
            action="store_true",
            help="load it although DEBUG is off (make run does: a demo on one machine)",
        )

    def handle(self, yes_demo, **options):
        if not settings.DEBUG and not yes_demo:
            raise CommandError(
                "seed_demo creates users whose passwords the README publishes, one of them "
                "staff: refused with DEBUG off. For a production catalog use apply_catalog "
                "FILE and createsuperuser; for a demo, add --yes-demo."
            )
        demo.load()
        history = load_history()
        self.stdout.write(
            "Demo loaded: region local-1, GPU models, specs, images, tenants acme and globex."
        )
        for invoice in history:
            self.stdout.write(
                f"  acme's invoice of {invoice.month:%B %Y}: {invoice.number or 'draft'}, "
                f"{invoice.status}, {invoice.total} {invoice.currency}"
            )
        for username, password, _staff, memberships in demo.USERS:
            where = (
                ", ".join(f"{role} of {slug}" for slug, role in memberships) or "operator (staff)"
            )
            self.stdout.write(f"  login {username} / {password}  ({where})")
