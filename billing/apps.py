from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"

    def ready(self) -> None:
        from billing import receivers
        from billing.budgets import ensure_launch_allowed
        from console.instances import hooks
        from console.instances.models import Instance
        from console.instances.signals import host_lost, instance_state_changed

        instance_state_changed.connect(
            receivers.on_instance_state_changed,
            sender=Instance,
            dispatch_uid="billing.usage_segments",
        )
        hooks.register_launch_check(ensure_launch_allowed)
        host_lost.connect(receivers.on_host_lost, sender=Instance, dispatch_uid="billing.host_lost")
