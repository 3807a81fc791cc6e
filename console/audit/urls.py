from django.urls import path

from console.audit import views

app_name = "audit"

urlpatterns = [
    path("", views.audit_log, name="log"),
    path("export.csv", views.audit_csv, name="csv"),
]
