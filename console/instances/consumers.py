"""/ws/events/: the state changes of the tenant's instances, live, for the console."""

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from accounts.websocket import StandingAccess, reading_member
from console.instances.lifecycle import events_group


class TenantEventsConsumer(AsyncJsonWebsocketConsumer):
    """Joins the group of the tenant the socket's membership belongs to; every transition of
    that tenant's instances arrives as {"type": "instance.state", "instance": {...}}, until
    the membership or the API token it came with is withdrawn (then it closes, 4403)."""

    group = None
    access: StandingAccess

    async def connect(self):
        membership = reading_member(self.scope, "instances:read")
        if membership is None:
            await self.close(code=4403)
            return
        self.access = StandingAccess(self.scope)
        self.group = events_group(membership.tenant_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self.send_json({"type": "hello", "tenant": membership.tenant.slug})

    async def disconnect(self, code):
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content, **kwargs):
        if content.get("type") == "ping":
            await self.send_json({"type": "pong"})

    async def instance_state(self, event):
        if not await self.access.holds():
            await self.close(code=4403)
            return
        await self.send_json(event["payload"])
