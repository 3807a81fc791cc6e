from django.apps import AppConfig


class RegistryCredentialsConfig(AppConfig):
    name = "console.registry_credentials"
    label = "registry_credentials"
    verbose_name = "Registry credentials"
