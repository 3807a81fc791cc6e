from django.urls import path

from console.notifications import views

app_name = "notifications"

urlpatterns = [
    path("", views.endpoints, name="endpoints"),
    path("<int:pk>/", views.endpoint, name="endpoint"),
    path("<int:pk>/test/", views.endpoint_test, name="endpoint-test"),
    path("<int:pk>/rotate-secret/", views.endpoint_rotate, name="endpoint-rotate"),
    path("<int:pk>/delete/", views.endpoint_delete, name="endpoint-delete"),
]
