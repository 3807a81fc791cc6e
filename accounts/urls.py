"""The console's account pages (under /, beside console.web's dashboard)."""

from django.contrib.auth import views as auth_views
from django.urls import path

from accounts import ssh_key_views, views

urlpatterns = [
    path(
        "login/",
        auth_views.LoginView.as_view(
            template_name="accounts/login.html", redirect_authenticated_user=True
        ),
        name="login",
    ),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("tenant/switch/", views.switch, name="switch-tenant"),
    path("members/", views.members, name="members"),
    path("members/<int:pk>/role/", views.member_role, name="member-role"),
    path("members/<int:pk>/remove/", views.member_remove, name="member-remove"),
    path(
        "members/invitations/<int:pk>/revoke/",
        views.invitation_revoke,
        name="invitation-revoke",
    ),
    path("invitations/<str:token>/", views.invitation, name="invitation"),
    path("tokens/", views.tokens, name="tokens"),
    path("tokens/<int:pk>/revoke/", views.token_revoke, name="token-revoke"),
    path("ssh-keys/", ssh_key_views.ssh_key_list, name="ssh-keys"),
    path("ssh-keys/<int:pk>/delete/", ssh_key_views.ssh_key_delete, name="ssh-key-delete"),
]
