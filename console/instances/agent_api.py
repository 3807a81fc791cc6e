"""`POST /agent/v1/events`: what an agent pushes about its allocations as it happens (a
workload that exits, fails or starts running; the progress of a launch; an ssh session
opened or ended). The host speaks only for itself; what the events change is decided in
outcomes.record_outcome (sessions: access.record_session). Each event takes its own time
(`at`, bounded by what the console knows there), and a batch is applied in the order of
those times, so events an agent buffered while the console was away are billed as they
happened, however late and in whatever order they arrive."""

from rest_framework import serializers, status
from rest_framework.response import Response

from console import activity, integers
from console.fleet.agent_api import AgentView, validated
from console.instances import access, outcomes
from console.instances.pull_progress import PullSerializer

DIGEST_PATTERN = r"\Asha256:[0-9a-f]{64}\Z"


class EventSerializer(serializers.Serializer):
    allocation = serializers.CharField(max_length=64)
    instance = integers.Field(min_value=1)
    kind = serializers.ChoiceField(choices=["state", "progress", "session"])
    # Other states (an agent newer than this console) are accepted and ignored.
    state = serializers.CharField(max_length=16, required=False, default="")
    reason = serializers.CharField(
        max_length=500, required=False, allow_blank=True, allow_null=True, default=""
    )
    exit_code = integers.Field(
        required=False, allow_null=True, default=None, min_value=-(2**31), max_value=2**31 - 1
    )
    # the digest its image was pulled at (sha256:…): the console pins a tenant's reference to it
    image_digest = serializers.RegexField(
        DIGEST_PATTERN, required=False, default="", allow_blank=True
    )
    at = serializers.DateTimeField()
    message = serializers.CharField(
        max_length=1000, required=False, allow_blank=True, allow_null=True, default=""
    )
    # An image pull's figures, with a progress event that reports one (agent/pulls.py).
    pull = PullSerializer(required=False, allow_null=True, default=None)
    # A session event's part in the idle watch (console.activity): an ssh session opened or ended.
    activity = serializers.ChoiceField(
        choices=["", "ssh.opened", "ssh.ended"], required=False, default=""
    )

    def validate(self, attrs):
        if attrs["kind"] == "state" and not attrs["state"]:
            raise serializers.ValidationError({"state": "A state event says its state."})
        if attrs["kind"] == "session" and not attrs["message"]:
            raise serializers.ValidationError({"message": "A session event says what happened."})
        return attrs


class EventsSerializer(serializers.Serializer):
    host_id = integers.Field()
    events = EventSerializer(many=True, max_length=1000)


def apply(host, event: dict) -> bool:
    """One event of `host`'s agent; answers whether it changed anything."""
    message = event["message"] or ""
    if event["kind"] == "progress":
        return outcomes.record_progress(
            host, event["instance"], event["allocation"], message, pull=event["pull"]
        )
    if event["kind"] == "session":
        recorded = access.record_session(
            event["instance"],
            message,
            at=event["at"],
            host=host,
            allocation_id=event["allocation"],
        )
        if recorded and event["activity"] == "ssh.opened":
            activity.opened(event["instance"], "ssh")
        elif recorded and event["activity"] == "ssh.ended":
            activity.ended(event["instance"], "ssh")
        return recorded
    outcome = outcomes.Outcome(
        allocation_id=event["allocation"],
        state=event["state"],
        reason=event["reason"] or "",
        exit_code=event["exit_code"],
        at=event["at"],
        message=message,
        image_digest=event["image_digest"],
    )
    return outcomes.record_outcome(host, event["instance"], outcome)


class EventsView(AgentView):
    def post(self, request):
        data = validated(EventsSerializer, request)
        host = self.speaking_host(request, data["host_id"])
        events = sorted(data["events"], key=lambda event: event["at"])
        applied = sum(apply(host, event) for event in events)
        accepted = len(data["events"])
        return Response(
            {"accepted": accepted, "applied": applied, "ignored": accepted - applied},
            status=status.HTTP_202_ACCEPTED,
        )
