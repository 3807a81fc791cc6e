"""{% idle_panel instance can_operate %}: the idle policy in force on the instance page, when it
acts, the keep-running button and the instance's own policy."""

from django import template

from console.idle import services
from console.idle.forms import PolicyForm
from console.idle.models import InstancePolicy

register = template.Library()


@register.inclusion_tag("idle/_panel.html")
def idle_panel(instance, can_operate: bool) -> dict:
    own = InstancePolicy.objects.filter(instance=instance).first()
    return {
        "instance": instance,
        "can_operate": can_operate,
        "status": services.status(instance),
        "own": own,
        "form": PolicyForm(instance=own),
    }
