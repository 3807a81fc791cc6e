"""An in-memory stand-in for console.fleet.agent_client, for unit tests of the tasks."""

from console.fleet.agent_client import AgentRejected, AgentUnavailable


class FakeAgents:
    """Allocations per host name, and a switch to make a host unavailable."""

    def __init__(self):
        self.hosts: dict[str, dict[str, dict]] = {}
        self.down: set[str] = set()
        self.calls: list[tuple] = []
        # What each host keeps of an instance after its allocations: its disk and its logs.
        self.logs: dict[str, dict[str, list[str]]] = {}
        self.deleted_instances: list[tuple[str, str]] = []
        # What a new allocation answers: "running", or "starting" (a launch that outlasts
        # the call; its outcome comes as an event).
        self.start_state = "running"
        # The keys each host lets into each instance (PUT /v1/instances/{pk}/ssh-keys).
        self.ssh_keys: dict[str, dict[str, list[dict]]] = {}
        self.members: dict[str, dict[str, list[str]]] = {}

    def _host(self, host):
        self.calls.append(host.name)
        if host.name in self.down:
            raise AgentUnavailable(host, "connection refused")
        return self.hosts.setdefault(host.name, {})

    def create_allocation(self, host, alloc_id, body):
        allocations = self._host(host)
        if alloc_id in allocations and allocations[alloc_id]["body"] != body:
            raise AgentRejected(host, "different body", 409, "conflict")
        allocations.setdefault(alloc_id, {"id": alloc_id, "state": self.start_state, "body": body})
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

    def instance_logs(self, host, instance_pk, tail):
        self._host(host)
        return self.logs.get(host.name, {}).get(str(instance_pk), [])[-tail:]

    def delete_instance_data(self, host, instance_pk):
        allocations = self._host(host)
        if any(a["body"]["labels"]["instance"] == str(instance_pk) for a in allocations.values()):
            raise AgentRejected(host, "an allocation of it is still here", 409, "instance_busy")
        self.logs.get(host.name, {}).pop(str(instance_pk), None)
        self.deleted_instances.append((host.name, str(instance_pk)))

    def set_ssh_keys(self, host, instance_pk, keys, members):
        self._host(host)
        self.ssh_keys.setdefault(host.name, {})[str(instance_pk)] = keys
        self.members.setdefault(host.name, {})[str(instance_pk)] = members
        return {"instance": str(instance_pk), "keys": len(keys)}

    def install(self, monkeypatch):
        from console.fleet import agent_client

        for name in (
            "create_allocation",
            "allocation_action",
            "delete_allocation",
            "list_allocations",
            "instance_logs",
            "delete_instance_data",
            "set_ssh_keys",
        ):
            monkeypatch.setattr(agent_client, name, getattr(self, name))
        return self
