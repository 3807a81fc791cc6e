from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "console.audit"
    label = "audit"
    verbose_name = "Audit log"

    def ready(self):
        from console.audit import capture

        capture.connect()
