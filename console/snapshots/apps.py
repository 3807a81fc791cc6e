from django.apps import AppConfig


class SnapshotsConfig(AppConfig):
    name = "console.snapshots"
    label = "snapshots"

    def ready(self):
        from console.instances import hooks
        from console.instances.models import Instance
        from console.instances.signals import instance_state_changed
        from console.snapshots import services

        hooks.register_provision_hold(services.hold_for_restore)
        instance_state_changed.connect(
            services.on_instance_terminated, sender=Instance, dispatch_uid="snapshots.terminated"
        )
