"""/agent/v1/: what host agents call, from the apps that answer it: fleet (register,
heartbeat), metrics (samples) and instances (events)."""

from django.urls import path

from console.fleet import agent_api
from console.instances.agent_api import EventsView
from console.metrics.agent_api import samples_view

urlpatterns = [
    path("register", agent_api.RegisterView.as_view(), name="agent-register"),
    path("heartbeat", agent_api.HeartbeatView.as_view(), name="agent-heartbeat"),
    path("samples", samples_view, name="agent-samples"),
    path("events", EventsView.as_view(), name="agent-events"),
]
