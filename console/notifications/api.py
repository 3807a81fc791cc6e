"""REST API of the tenant's notification endpoints: /api/v1/notifications/endpoints/…
Admins and owners only: an endpoint's URL (a Slack hook's above all) is itself a secret."""

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from accounts.permissions import request_membership
from accounts.roles import MANAGE
from console.notifications import services
from console.notifications.models import Attempt, Endpoint
from console.notifications.serializers import (
    AttemptSerializer,
    EndpointSerializer,
    EndpointUpdateSerializer,
    EndpointWithSecretSerializer,
    RotatedSecretSerializer,
    TestDeliverySerializer,
)


def _field_errors(error: DjangoValidationError) -> ValidationError:
    return ValidationError(error.message_dict if hasattr(error, "error_dict") else error.messages)


class EndpointViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Where the tenant hears of what happens (failed instances, budget thresholds, host
    maintenance, invoices …): email addresses, Slack-compatible incoming webhooks and signed
    webhooks, each with the kinds of notice it receives."""

    serializer_class = EndpointSerializer
    lookup_value_regex = "[0-9]+"
    read_role = MANAGE
    write_role = MANAGE
    api_scopes = {
        "list": "notifications:read",
        "retrieve": "notifications:read",
        "deliveries": "notifications:read",
        "create": "notifications:write",
        "partial_update": "notifications:write",
        "destroy": "notifications:write",
        "test": "notifications:write",
        "rotate_secret": "notifications:write",
    }

    def get_queryset(self):
        return Endpoint.objects.filter(tenant=request_membership(self.request).tenant)

    @extend_schema(request=EndpointSerializer, responses={201: EndpointWithSecretSerializer})
    def create(self, request):
        body = EndpointSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        try:
            endpoint, secret = services.create_endpoint(
                request_membership(request).tenant,
                name=data["name"],
                channel=data["channel"],
                target=data["target"],
                kinds=data["kinds"],
                enabled=data.get("enabled", True),
            )
        except DjangoValidationError as error:
            raise _field_errors(error) from None
        endpoint.secret = secret
        return Response(EndpointWithSecretSerializer(endpoint).data, status=201)

    @extend_schema(request=EndpointUpdateSerializer, responses=EndpointSerializer)
    def partial_update(self, request, pk=None):
        endpoint = self.get_object()
        body = EndpointUpdateSerializer(endpoint, data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        try:
            services.update_endpoint(endpoint, **body.validated_data)
        except DjangoValidationError as error:
            raise _field_errors(error) from None
        return Response(EndpointSerializer(endpoint).data)

    def perform_destroy(self, instance):
        services.delete_endpoint(instance)

    @extend_schema(request=None, responses={202: TestDeliverySerializer})
    @action(detail=True, methods=["post"])
    def test(self, request, pk=None):
        """Send a test notice to this endpoint; its outcome shows in the delivery log."""
        delivery = services.send_test(self.get_object())
        detail = "A test notice is on its way; its outcome shows in the delivery log."
        return Response({"delivery": delivery.pk, "detail": detail}, status=202)

    @extend_schema(request=None, responses=RotatedSecretSerializer)
    @action(detail=True, methods=["post"], url_path="rotate-secret")
    def rotate_secret(self, request, pk=None):
        """A new signing secret (webhooks), shown this once; the replaced one keeps signing
        each delivery too until `previous_valid_until`."""
        endpoint = self.get_object()
        secret = services.rotate_secret(endpoint)
        return Response(
            {"secret": secret, "previous_valid_until": endpoint.previous_secret_expires_at}
        )

    @extend_schema(request=None, responses=AttemptSerializer(many=True))
    @action(detail=True, methods=["get"])
    def deliveries(self, request, pk=None):
        """The endpoint's delivery log, newest first: every attempt with its status code,
        latency, response excerpt and error."""
        endpoint = self.get_object()
        attempts = Attempt.objects.filter(endpoint=endpoint).select_related("delivery__notice")
        page = self.paginate_queryset(attempts)
        return self.get_paginated_response(AttemptSerializer(page, many=True).data)
