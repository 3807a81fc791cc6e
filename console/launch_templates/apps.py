from django.apps import AppConfig


class LaunchTemplatesConfig(AppConfig):
    name = "console.launch_templates"
    label = "launch_templates"
    verbose_name = "Launch templates"
