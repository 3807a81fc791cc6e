from django.core.management.base import BaseCommand, CommandError

from console.catalog import apply


class Command(BaseCommand):
    help = (
        "Make the catalog (regions, GPU models, MIG profiles, specs, prices, images) what a "
        "TOML file says; print each change. Running it again changes nothing."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "file", help="the catalog, e.g. console/catalog/examples/catalog.example.toml"
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="print what would change, change nothing"
        )

    def handle(self, file, dry_run, **options):
        try:
            result = apply.apply(apply.load(file), dry_run=dry_run)
        except apply.CatalogError as error:
            for problem in error.problems:
                self.stderr.write(problem)
            raise CommandError(
                f"{file}: nothing changed ({len(error.problems)} problem(s))."
            ) from None
        for change in result.changes:
            self.stdout.write(change)
        if not result.changes:
            self.stdout.write("No changes.")
        elif dry_run:
            self.stdout.write(f"{len(result.changes)} change(s) would be made (dry run).")
        else:
            self.stdout.write(f"{len(result.changes)} change(s) applied.")
