from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "console.notifications"
    label = "notifications"

    def ready(self) -> None:
        from console.notices import notice
        from console.notifications import receivers

        notice.connect(receivers.on_notice, dispatch_uid="notifications.deliver")
