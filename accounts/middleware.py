from django.utils.functional import SimpleLazyObject

from accounts.tenancy import session_membership


class CurrentTenantMiddleware:
    """Sets `request.membership` (and `request.tenant`) for signed-in browser sessions."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        request.membership = SimpleLazyObject(lambda: session_membership(request))
        request.tenant = SimpleLazyObject(
            lambda: request.membership.tenant if request.membership else None
        )
        return self.get_response(request)
