from django.apps import AppConfig


class IdleConfig(AppConfig):
    name = "console.idle"
    label = "idle"
    verbose_name = "Idle policies"
