from django.apps import AppConfig


class MetricsConfig(AppConfig):
    name = "console.metrics"
    label = "metrics"
