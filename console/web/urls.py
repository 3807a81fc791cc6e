from django.urls import path

from console.web import views

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
]
