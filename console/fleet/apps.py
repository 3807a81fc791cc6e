from django.apps import AppConfig
from django.conf import settings


class FleetConfig(AppConfig):
    name = "console.fleet"
    label = "fleet"

    def ready(self):
        from console import logs
        from console.fleet import images  # noqa: F401 - connects its receivers to the catalog

        # Under uvicorn: no access line for each agent's sample push and heartbeat.
        logs.adopt_uvicorn_loggers(json_lines=settings.LOG_FORMAT == "json")
