from django.urls import path, re_path

from billing import views

app_name = "billing"

urlpatterns = [
    path("usage/", views.usage, name="usage"),
    path("budget-notice/dismiss/", views.dismiss_budget_notice, name="dismiss-budget-notice"),
    path("invoices/", views.invoice_list, name="invoices"),
    path("invoices/<int:pk>/", views.invoice_detail, name="invoice"),
    re_path(
        r"^invoices/(?P<pk>[0-9]+)/download/(?P<fmt>csv|json|pdf)/\Z",
        views.invoice_download,
        name="invoice-download",
    ),
]
