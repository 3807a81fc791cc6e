from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"

    def ready(self) -> None:
        from billing.receivers import on_instance_state_changed
        from console.instances.models import Instance
        from console.instances.signals import instance_state_changed

        instance_state_changed.connect(
            on_instance_state_changed, sender=Instance, dispatch_uid="billing.usage_segments"
        )
