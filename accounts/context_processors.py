from accounts.models import Membership


def tenancy(request):
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    membership = request.membership or None
    return {
        "membership": membership,
        "current_tenant": membership.tenant if membership else None,
        "all_memberships": Membership.objects.select_related("tenant").filter(user=user),
    }
