from django.apps import AppConfig


class MetricsConfig(AppConfig):
    name = "console.metrics"
    label = "metrics"

    def ready(self):
        from console.instances.signals import instance_state_changed
        from console.metrics import launches, task_outcomes

        instance_state_changed.connect(launches.on_state_changed, dispatch_uid="metrics-launches")
        task_outcomes.connect()
