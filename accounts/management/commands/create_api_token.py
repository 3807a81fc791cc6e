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

    def handle(self, username, tenant, name, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user named {username!r}.")
        tenant_obj = Tenant.objects.filter(slug=tenant).first()
        if tenant_obj is None:
            raise CommandError(f"No tenant with slug {tenant!r}.")
        try:
            issued = services.issue_token(user, tenant_obj, name)
        except ValidationError as error:
            raise CommandError(" ".join(error.messages)) from None
        self.stderr.write(f"Token {name!r} for {username} in {tenant_obj.slug}; shown once:")
        self.stdout.write(issued.raw)
