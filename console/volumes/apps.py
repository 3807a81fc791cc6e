from django.apps import AppConfig


class VolumesConfig(AppConfig):
    name = "console.volumes"
    label = "volumes"

    def ready(self):
        from console.instances.models import Instance
        from console.instances.signals import launching, terminating
        from console.volumes import services

        launching.connect(services.attach_at_launch, sender=Instance, dispatch_uid="volumes.launch")
        terminating.connect(
            services.on_terminating, sender=Instance, dispatch_uid="volumes.terminating"
        )
