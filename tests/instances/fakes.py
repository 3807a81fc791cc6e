"""An in-memory stand-in for console.fleet.agent_client, for unit tests of the tasks."""

from console.fleet.agent_client import AgentRejected, AgentUnavailable


class FakeAgents:
    """Allocations per host name, and a switch to make a host unavailable."""

    def __init__(self):
        self.hosts: dict[str, dict[str, dict]] = {}
        self.down: set[str] = set()
        self.calls: list[tuple] = []

    def _host(self, host):
        self.calls.append(host.name)
        if host.name in self.down:
            raise AgentUnavailable(host, "connection refused")
        return self.hosts.setdefault(host.name, {})

    def create_allocation(self, host, alloc_id, body):
        allocations = self._host(host)
        if alloc_id in allocations and allocations[alloc_id]["body"] != body:
            raise AgentRejected(host, "different body", 409, "conflict")
        allocations.setdefault(alloc_id, {"id": alloc_id, "state": "running", "body": body})
        return allocations[alloc_id]

    def allocation_action(self, host, alloc_id, action):
        allocations = self._host(host)
        if alloc_id not in allocations:
            raise AgentRejected(host, "unknown allocation", 404, "not_found")
        allocations[alloc_id]["state"] = {"stop": "stopped"}.get(action, "running")
        return allocations[alloc_id]

    def delete_allocation(self, host, alloc_id):
        self._host(host).pop(alloc_id, None)

    def list_allocations(self, host):
        return list(self._host(host).values())

    def install(self, monkeypatch):
        from console.fleet import agent_client

        for name in (
            "create_allocation",
            "allocation_action",
            "delete_allocation",
            "list_allocations",
        ):
            monkeypatch.setattr(agent_client, name, getattr(self, name))
        return self
