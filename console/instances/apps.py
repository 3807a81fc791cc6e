from django.apps import AppConfig


class InstancesConfig(AppConfig):
    name = "console.instances"
    label = "instances"
