from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from accounts import services
from accounts.management.commands.create_tenant import describe_error
from accounts.models import Membership, Tenant
from accounts.roles import Role


class Command(BaseCommand):
    help = "Create a user (or update it) and make it a member of a tenant with a role."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--tenant", required=True, help="tenant slug")
        parser.add_argument("--role", required=True, help=f"one of {', '.join(Role.values)}")
        parser.add_argument("--password")
        parser.add_argument("--email", default="")

    @transaction.atomic
    def handle(self, username, tenant, role, password, email, **options):
        if role not in Role.values:
            raise CommandError(f"Unknown role {role!r}; use one of {', '.join(Role.values)}.")
        tenant_obj = Tenant.objects.filter(slug=tenant).first()
        if tenant_obj is None:
            raise CommandError(f"No tenant with slug {tenant!r}.")
        try:
            user = services.ensure_user(username, password=password, email=email)
            membership = Membership.objects.filter(user=user, tenant=tenant_obj).first()
            if membership is None:
                services.add_member(tenant_obj, user, role)
            elif membership.role != role:
                services.change_role(membership, role)
        except ValidationError as error:
            raise CommandError(describe_error(error)) from None
        self.stdout.write(f"{username} is {role} of {tenant_obj.slug}.")
