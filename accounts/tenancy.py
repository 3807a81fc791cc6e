"""Which tenant a browser session is working in."""

from accounts.models import Membership

SESSION_KEY = "tenant_id"


def session_membership(request) -> Membership | None:
    """The membership for the tenant chosen in this session, else the user's first one."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return None
    memberships = Membership.objects.select_related("tenant").filter(user=user)
    chosen = request.session.get(SESSION_KEY)
    if chosen is not None:
        membership = memberships.filter(tenant_id=chosen).first()
        if membership is not None:
            return membership
    return memberships.order_by("tenant__name").first()


def switch_tenant(request, tenant_id: int) -> Membership | None:
    membership = (
        Membership.objects.select_related("tenant")
        .filter(user=request.user, tenant_id=tenant_id)
        .first()
    )
    if membership is not None:
        request.session[SESSION_KEY] = membership.tenant_id
    return membership
