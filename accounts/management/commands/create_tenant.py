from decimal import Decimal, InvalidOperation

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from accounts import services
from accounts.models import Tenant


def _decimal(option: str, value: str | None) -> Decimal | None:
    if value is None:
        return None
    try:
        number = Decimal(value)
    except InvalidOperation:
        number = None
    if number is None or not number.is_finite():
        raise CommandError(f"{option}: {value!r} is not a decimal number")
    return number


class Command(BaseCommand):
    help = "Create a tenant with its quota; with an existing slug, set the options given."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--name")
        parser.add_argument("--gpu-quota", help="GPU-equivalents, e.g. 1.5")
        parser.add_argument("--max-instances", type=int)
        parser.add_argument("--monthly-budget", help="e.g. 100.00")

    def handle(self, slug, name, gpu_quota, max_instances, monthly_budget, **options):
        quota_options = {
            key: value
            for key, value in {
                "gpu_quota": _decimal("--gpu-quota", gpu_quota),
                "max_instances": max_instances,
                "monthly_budget": _decimal("--monthly-budget", monthly_budget),
            }.items()
            if value is not None
        }
        tenant = Tenant.objects.filter(slug=slug).first()
        try:
            if tenant is None:
                tenant = services.create_tenant(slug, name or "", **quota_options)
                self.stdout.write(f"Created tenant {tenant.slug} ({tenant.name}).")
                return
            if name and name != tenant.name:
                tenant.name = name
                tenant.full_clean()
                tenant.save(update_fields=["name"])
            services.update_quota(tenant.quota, **quota_options)
        except ValidationError as error:
            raise CommandError(describe_error(error)) from None
        self.stdout.write(f"Tenant {tenant.slug} exists; settings applied.")


def describe_error(error: ValidationError) -> str:
    if hasattr(error, "error_dict"):
        return "; ".join(f"{field}: {' '.join(msgs)}" for field, msgs in error.message_dict.items())
    return " ".join(error.messages)
