"""manage.py create_join_token --region CODE [--note ...] [--ttl-hours N]

Prints what the token is for, then the raw token alone on the last line (for scripts:
`TOKEN=$(manage.py create_join_token --region local-1 | tail -n1)`)."""

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from console.fleet import services


class Command(BaseCommand):
    help = "Create a one-time join token that lets one new GPU host register its agent."

    def add_arguments(self, parser):
        parser.add_argument("--region", required=True, help="region code, e.g. local-1")
        parser.add_argument("--note", default="", help="what the token is for, e.g. rack 4")
        parser.add_argument(
            "--ttl-hours", type=float, default=None, help="hours it stays valid (default: settings)"
        )

    def handle(self, *args, region, note, ttl_hours, **options):
        try:
            token, raw = services.create_join_token(region, note=note, ttl_hours=ttl_hours)
        except ValidationError as error:
            raise CommandError(" ".join(error.messages)) from None
        self.stdout.write(
            f"Join token {token.prefix}… for region {token.region.code}, valid until "
            f"{token.expires_at:%Y-%m-%d %H:%M} UTC, registers one host. Shown only now:"
        )
        self.stdout.write(raw)
