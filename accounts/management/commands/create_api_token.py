from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from accounts import services
from accounts.models import Tenant


class Command(BaseCommand):
    help = "Issue an API token for a user in a tenant; the token is the last line of output."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--tenant", required=True, help="tenant slug")
        parser.add_argument("--name", default="cli")
        parser.add_argument(
            "--read-only", action="store_true", help="a token that reads only (acts as a viewer)"
        )
        parser.add_argument(
            "--scope",
            action="append",
            dest="scopes",
            help="a scope it holds, e.g. instances:read (repeat; default: what the role allows)",
        )
        parser.add_argument(
            "--instance-prefix", default="", help="only instances whose name starts with this"
        )

    def handle(self, username, tenant, name, read_only, scopes, instance_prefix, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user named {username!r}.")
        tenant_obj = Tenant.objects.filter(slug=tenant).first()
        if tenant_obj is None:
            raise CommandError(f"No tenant with slug {tenant!r}.")
        try:
            issued = services.issue_token(
                user,
                tenant_obj,
                name,
                read_only=read_only,
                scopes=scopes,
                instance_prefix=instance_prefix,
            )
        except ValidationError as error:
            raise CommandError(" ".join(error.messages)) from None
        kind = "Read-only token" if issued.token.read_only else "Token"
        self.stderr.write(f"{kind} {name!r} for {username} in {tenant_obj.slug}; shown once:")
        self.stdout.write(issued.raw)
