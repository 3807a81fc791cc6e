"""REST API of instances: /api/v1/instances/…"""

import functools

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.response import Response

from accounts import scopes
from accounts.permissions import request_membership
from accounts.roles import OPERATE, READ
from console import integers
from console.instances import access, listing, services
from console.instances.models import Instance, OnHostLoss, State
from console.instances.serializers import (
    InstanceEventSerializer,
    InstanceSerializer,
    LaunchSerializer,
    LogsSerializer,
    ResizeSerializer,
    SaveTemplateSerializer,
    TerminateSerializer,
)
from console.launch_templates import services as template_services
from console.launch_templates.serializers import TemplateSerializer

MAX_TAIL = 10000


class InstanceViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """The tenant's instances. Writes answer 202: the work goes on in the background; watch
    `state` (or /ws/events/) for the outcome."""

    serializer_class = InstanceSerializer
    lookup_value_regex = "[0-9]+"
    read_role = READ
    write_role = OPERATE
    api_scopes = {
        "list": "instances:read",
        "retrieve": "instances:read",
        "events": "instances:read",
        "logs": "instances:read",
        "create": "instances:launch",
        "save_template": "templates:write",
        "start": "instances:start",
        "stop": "instances:stop",
        "reboot": "instances:reboot",
        "resize": "instances:resize",
        "terminate": "instances:terminate",
    }
    # a refused create is recorded as the launch it asked for (console.audit.refusals)
    audit_verbs = {"create": "launch"}

    def get_queryset(self):
        membership = request_membership(self.request)
        instances = Instance.objects.filter(tenant=membership.tenant)
        prefix = scopes.instance_prefix(membership)
        return instances.filter(name__startswith=prefix) if prefix else instances

    def _list_filters(self) -> dict:
        """The list's filters from the query string: ?state=a,b and ?name=."""
        filters = {}
        states = [s for s in self.request.query_params.get("state", "").split(",") if s]
        unknown = sorted(set(states) - set(State.values))
        if unknown:
            raise ValidationError({"state": [f"Unknown state(s): {', '.join(unknown)}."]})
        if states:
            filters["state__in"] = states
        name = self.request.query_params.get("name")
        if name:
            filters["name"] = name
        return filters

    def _represent(self, rows) -> list[dict]:
        request = self.request
        return listing.represent(
            rows,
            shell=access.shell_member(request_membership(request)),
            staff=request.user.is_staff,
            base_url=request.build_absolute_uri("/")[:-1],
        )

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "state",
                str,
                enum=State.values,
                many=True,
                explode=False,
                description="one state or several, comma-separated",
            ),
            OpenApiParameter("name", str),
        ]
    )
    def list(self, request, *args, **kwargs):
        membership = request_membership(request)
        found = listing.rows(
            membership.tenant,
            name_prefix=scopes.instance_prefix(membership),
            **self._list_filters(),
        )
        page = self.paginate_queryset(found)
        return self.get_paginated_response(self._represent(page))

    def _shown(self, pk) -> dict:
        """One of the tenant's instances as the API shows it; 404 if the tenant has no such."""
        membership = request_membership(self.request)
        prefix = scopes.instance_prefix(membership)
        pk = integers.reference_id(pk)  # the URL's digits, or an id of ours
        rows = list(listing.rows(membership.tenant, name_prefix=prefix, pk=pk)) if pk else []
        if not rows:
            raise NotFound()
        return self._represent(rows)[0]

    def retrieve(self, request, pk=None):
        return Response(self._shown(pk))

    def _respond(self, instance, code=status.HTTP_202_ACCEPTED):
        return Response(self._shown(instance.pk), status=code)

    @extend_schema(request=LaunchSerializer, responses={202: InstanceSerializer})
    def create(self, request):
        body = LaunchSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        membership = request_membership(request)
        tenant = membership.tenant
        prefix = scopes.instance_prefix(membership)
        if not (body.validated_data.get("name") or "").startswith(prefix):
            raise ValidationError({"name": [scopes.prefix_refusal(prefix)]})
        given = dict(body.validated_data)
        template = given.pop("template", None)
        given["secrets"] = given.pop("secret_env", None)
        launch = {field: given.pop(field, None) for field in template_services.FIELDS}
        if template:
            launch = template_services.launch_fields(
                template_services.find(tenant, template), launch
            )
        if prefix and launch["volumes"]:  # attaching is volumes:write, never a prefix token's
            raise ValidationError({"volumes": [scopes.volumes_refusal(prefix)]})
        instance = services.launch_instance(
            tenant,
            name=given.get("name"),
            ssh_keys=given.get("ssh_keys"),
            actor=request.user,
            **{**launch, "on_host_loss": launch["on_host_loss"] or OnHostLoss.KEEP_DISK},
        )
        return self._respond(instance)

    def _act(self, function, *args):
        instance = self.get_object()
        instance = function(instance, *args, actor=self.request.user)
        return self._respond(instance)

    @extend_schema(request=SaveTemplateSerializer, responses={201: TemplateSerializer})
    @action(detail=True, methods=["post"], url_path="save-template")
    def save_template(self, request, pk=None):
        """Save what the instance was launched with (spec, image, region, command, env and
        secrets, ports, disk, restart policy) as a template of the tenant."""
        body = SaveTemplateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        instance = self.get_object()
        template = template_services.save_from_instance(
            instance, body.validated_data["name"], actor=request.user
        )
        shown = TemplateSerializer(template, context={"tenant": instance.tenant})
        return Response(shown.data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={202: InstanceSerializer})
    @action(detail=True, methods=["post"])
    def stop(self, request, pk=None):
        return self._act(services.stop_instance)

    @extend_schema(request=None, responses={202: InstanceSerializer})
    @action(detail=True, methods=["post"])
    def start(self, request, pk=None):
        return self._act(services.start_instance)

    @extend_schema(request=None, responses={202: InstanceSerializer})
    @action(detail=True, methods=["post"])
    def reboot(self, request, pk=None):
        return self._act(services.reboot_instance)

    @extend_schema(request=TerminateSerializer, responses={202: InstanceSerializer})
    @action(detail=True, methods=["post"])
    def terminate(self, request, pk=None):
        body = TerminateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        keep_disk = body.validated_data["keep_disk"]
        return self._act(functools.partial(services.terminate_instance, keep_disk=keep_disk))

    @extend_schema(request=ResizeSerializer, responses={202: InstanceSerializer})
    @action(detail=True, methods=["post"])
    def resize(self, request, pk=None):
        """Another spec, one that a host of the instance's region (or the host that holds
        its disk) can hold; 400 on `spec` otherwise. The disk stays as it is unless
        `disk_gib` asks for more (400 on a smaller one). On a running instance, a resize
        that changes only vCPUs and RAM applies live (it keeps running); one that restarts it
        needs `allow_restart`, one that stops it needs `allow_stop` (400 on that field
        otherwise, saying what it would do)."""
        body = ResizeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return self._act(
            lambda instance, actor: services.resize_instance(
                instance,
                body.validated_data["spec"],
                disk_gib=body.validated_data.get("disk_gib"),
                allow_restart=body.validated_data["allow_restart"],
                allow_stop=body.validated_data["allow_stop"],
                actor=actor,
            )
        )

    @extend_schema(request=None, responses=InstanceEventSerializer(many=True))
    @action(detail=True, methods=["get"])
    def events(self, request, pk=None):
        instance = self.get_object()
        events = instance.events.order_by("at", "pk")
        page = self.paginate_queryset(events)
        if page is not None:
            return self.get_paginated_response(InstanceEventSerializer(page, many=True).data)
        return Response(InstanceEventSerializer(events, many=True).data)

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "tail",
                {"type": "integer", "minimum": 1, "maximum": MAX_TAIL, "default": 100},
                description=f"how many of the last lines (1 to {MAX_TAIL}, default 100)",
            )
        ],
        responses={200: LogsSerializer},
    )
    @action(detail=True, methods=["get"])
    def logs(self, request, pk=None):
        """What the workload wrote to stdout and stderr, most recent last: this run's and
        the earlier ones' (readable while stopped or failed, gone once terminated). 503
        when its host does not answer."""
        try:
            tail = integers.parse(
                request.query_params.get("tail", "100"), minimum=1, maximum=MAX_TAIL
            )
        except integers.NotAWholeNumber as error:
            raise ValidationError({"tail": [str(error)]}) from None
        instance = self.get_object()
        if instance.state == State.TERMINATED:
            raise NotFound("A terminated instance's logs are deleted with its disk.")
        lines = services.instance_logs(instance, tail)
        return Response({"instance": instance.pk, "lines": lines})
