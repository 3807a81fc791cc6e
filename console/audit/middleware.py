from console.audit import context


class AuditActorMiddleware:
    """Makes the request's person the actor of the changes made while it is served. Placed
    after AuthenticationMiddleware; API token requests get their user (and token) when DRF
    authenticates them, on this same request."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        with context.serving(request):
            return self.get_response(request)
