from django.apps import AppConfig


class InstancesConfig(AppConfig):
    name = "console.instances"
    label = "instances"

    def ready(self):
        from console.instances import suspension  # noqa: F401 - connects its receiver
