"""`POST /agent/v1/samples` through the URLconf, for what does not take console/asgi.py's
direct route (see samples.py)."""

from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from console.metrics import samples


@csrf_exempt
@require_POST
def samples_view(request):
    """The secret is checked before the body is read, and the body is read up to one byte
    past the limit."""
    try:
        host = samples.authenticate(request.headers.get("Authorization", ""))
    except samples.BatchRefused as refused:
        return JsonResponse(refused.answer, status=refused.status)
    body = request.read(samples.MAX_BODY_BYTES + 1)
    status_code, answer = samples.accept_body(host, body)
    return JsonResponse(answer, status=status_code)
