from django.apps import AppConfig


class SnapshotsConfig(AppConfig):
    name = "console.snapshots"
    label = "snapshots"

    def ready(self):
        from console.instances.models import Instance
        from console.instances.signals import instance_state_changed, provision_held
        from console.snapshots import services

        provision_held.connect(
            services.hold_for_restore, sender=Instance, dispatch_uid="snapshots.unshelve"
        )
        instance_state_changed.connect(
            services.on_instance_terminated, sender=Instance, dispatch_uid="snapshots.terminated"
        )
