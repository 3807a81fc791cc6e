from django.core.management.base import BaseCommand

from console.catalog import demo


class Command(BaseCommand):
    help = "Load the demo catalog, tenants and users. Running it again changes nothing."

    def handle(self, **options):
        demo.load()
        self.stdout.write(
            "Demo loaded: region local-1, GPU models, specs, images, tenants acme and globex."
        )
        for username, password, _staff, memberships in demo.USERS:
            where = (
                ", ".join(f"{role} of {slug}" for slug, role in memberships) or "operator (staff)"
            )
            self.stdout.write(f"  login {username} / {password}  ({where})")
