from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"

    def ready(self) -> None:
        from accounts.models import Tenant
        from billing import receivers
        from console.instances.models import Instance
        from console.instances.signals import host_lost, instance_state_changed, launch_requested

        instance_state_changed.connect(
            receivers.on_instance_state_changed,
            sender=Instance,
            dispatch_uid="billing.usage_segments",
        )
        launch_requested.connect(
            receivers.on_launch_requested, sender=Tenant, dispatch_uid="billing.budget_gate"
        )
        host_lost.connect(receivers.on_host_lost, sender=Instance, dispatch_uid="billing.host_lost")
