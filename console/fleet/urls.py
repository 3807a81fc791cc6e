"""/fleet/: the operators' fleet page (staff only)."""

from django.urls import path

from console.fleet import views

app_name = "fleet"

urlpatterns = [
    path("", views.index, name="index"),
    path("hosts/<int:pk>/", views.host_detail, name="host"),
    path("hosts/<int:pk>/status/", views.host_status, name="host-status"),
    path(
        "hosts/<int:pk>/images/clean-up/", views.host_images_clean_up, name="host-images-clean-up"
    ),
    path("hosts/<int:pk>/address/", views.host_address, name="host-address"),
    path(
        "hosts/<int:pk>/secret/rotate/",
        views.host_secret,
        {"revoke": False},
        name="host-secret-rotate",
    ),
    path(
        "hosts/<int:pk>/secret/revoke/",
        views.host_secret,
        {"revoke": True},
        name="host-secret-revoke",
    ),
    path("gpus/<int:pk>/mode/", views.gpu_mode, name="gpu-mode"),
    path("join-tokens/", views.join_token_create, name="join-token-create"),
    path("join-tokens/<int:pk>/revoke/", views.join_token_revoke, name="join-token-revoke"),
]
