from django.urls import path
from rest_framework.routers import DefaultRouter

from billing.api import InvoiceViewSet, UsageView

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("invoices", InvoiceViewSet, basename="invoice")

urlpatterns = [
    path("usage/", UsageView.as_view(), name="billing-usage"),
    *router.urls,
]
