from django.urls import path

from console.idle.api import InstancePolicyView, KeepRunningView, TenantPolicyView

urlpatterns = [
    path("idle-policy/", TenantPolicyView.as_view(), name="idle-policy"),
    path(
        "instances/<int:pk>/idle-policy/",
        InstancePolicyView.as_view(),
        name="instance-idle-policy",
    ),
    path(
        "instances/<int:pk>/keep-running/", KeepRunningView.as_view(), name="instance-keep-running"
    ),
]
