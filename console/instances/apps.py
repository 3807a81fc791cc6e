from django.apps import AppConfig


class InstancesConfig(AppConfig):
    name = "console.instances"
    label = "instances"

    def ready(self):
        from console.instances import access, recovery, suspension  # noqa: F401 - connect receivers
