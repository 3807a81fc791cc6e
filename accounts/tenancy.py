"""Which tenant a browser session is working in."""

from accounts.models import Membership

SESSION_KEY = "tenant_id"


def chosen_membership(user, session) -> Membership | None:
    """The user's membership in the tenant chosen in this session, else their first one."""
    if user is None or not user.is_authenticated:
        return None
    memberships = Membership.objects.select_related("tenant").filter(user=user)
    chosen = session.get(SESSION_KEY) if session is not None else None
    if chosen is not None:
        membership = memberships.filter(tenant_id=chosen).first()
        if membership is not None:
            return membership
    return memberships.order_by("tenant__name").first()


def session_membership(request) -> Membership | None:
    return chosen_membership(getattr(request, "user", None), request.session)


def switch_tenant(request, tenant_id: int) -> Membership | None:
    membership = (
        Membership.objects.select_related("tenant")
        .filter(user=request.user, tenant_id=tenant_id)
        .first()
    )
    if membership is not None:
        request.session[SESSION_KEY] = membership.tenant_id
    return membership
