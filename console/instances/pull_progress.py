"""An image pull's progress as its agent reports it (agent/pulls.py: layers and bytes done of
total, seconds left at the rate so far) and as the console shows it: a bar on the instance
page (redrawn live: each report is a live update of the instance) and in the API's
`pull_progress`, which `gpucloud launch --wait` draws. The text of each report stays the
instance's event and reason; these figures go with the reason and go when it changes."""

import math

from rest_framework import serializers

from console import integers
from console.fleet.images import human_size


class PullSerializer(serializers.Serializer):
    """The figures of one report, as an agent sends them with its progress event."""

    reference = serializers.CharField(max_length=255)
    layers_done = integers.Field()
    layers_total = integers.Field()
    bytes_done = integers.Field()
    bytes_total = integers.Field()
    eta_seconds = integers.Field(allow_null=True, required=False, default=None)
    done = serializers.BooleanField(required=False, default=False)

    def validate(self, attrs):
        # an agent's rounding (or a layer restarted) must not draw a bar past its end
        attrs["layers_done"] = min(attrs["layers_done"], attrs["layers_total"])
        attrs["bytes_done"] = min(attrs["bytes_done"], attrs["bytes_total"])
        return attrs


def percent(pull: dict) -> int:
    """How far it got, 0 to 100: by bytes where the sizes are known, else by layers."""
    if pull.get("done"):
        return 100
    if pull.get("bytes_total"):
        return math.floor(100 * pull["bytes_done"] / pull["bytes_total"])
    if pull.get("layers_total"):
        return math.floor(100 * pull["layers_done"] / pull["layers_total"])
    return 0


def eta_text(seconds: int | None) -> str:
    """`about 40 s left`, `about 3 min left`; "" when not known."""
    if seconds is None:
        return ""
    if seconds < 60:
        return f"about {seconds} s left"
    if seconds < 3600:
        return f"about {math.ceil(seconds / 60)} min left"
    return f"about {seconds / 3600:.1f} h left"


def summary(pull: dict) -> str:
    """`3 of 5 layers · 1.2 GB of 3.4 GB · about 40 s left` (the agent's words, and the ETA)."""
    parts = [f"{pull['layers_done']} of {pull['layers_total']} layers"]
    if pull.get("bytes_total"):
        parts.append(f"{human_size(pull['bytes_done'])} of {human_size(pull['bytes_total'])}")
    if not pull.get("done") and (left := eta_text(pull.get("eta_seconds"))):
        parts.append(left)
    return " · ".join(parts)


def describe(pull: dict) -> dict | None:
    """What the instance page draws of `pull` (its Instance.pull_progress): the reference, a
    percent and the summary; None when no pull is reported."""
    if not pull:
        return None
    return {"reference": pull["reference"], "percent": percent(pull), "summary": summary(pull)}
