"""/agent/v1/: what host agents call."""

from django.urls import path

from console.fleet import agent_api
from console.instances.agent_api import EventsView

urlpatterns = [
    path("register", agent_api.RegisterView.as_view(), name="agent-register"),
    path("heartbeat", agent_api.HeartbeatView.as_view(), name="agent-heartbeat"),
    path("samples", agent_api.samples_view, name="agent-samples"),
    path("events", EventsView.as_view(), name="agent-events"),
]
