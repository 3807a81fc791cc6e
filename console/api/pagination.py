"""Pages of a list: `?limit=` (1 to 500, default 50) and `?offset=` (0 or more).

DRF's LimitOffsetPagination quietly ignores a limit or offset it cannot read; a client that
typed `?offset=1O` deserves to hear about it, so here it is a 400 naming the parameter."""

from rest_framework import pagination
from rest_framework.exceptions import ValidationError

MAX_LIMIT = 500


def _whole_number(request, name: str, minimum: int, default: int | None) -> int | None:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise ValidationError({name: [f"Must be a whole number, at least {minimum}."]})
    return value


class LimitOffsetPagination(pagination.LimitOffsetPagination):
    max_limit = MAX_LIMIT

    def get_limit(self, request):
        limit = _whole_number(request, self.limit_query_param, 1, self.default_limit)
        return min(limit, self.max_limit) if limit is not None else None

    def get_offset(self, request):
        return _whole_number(request, self.offset_query_param, 0, 0)

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        bounds = {
            self.limit_query_param: {"minimum": 1, "maximum": self.max_limit},
            self.offset_query_param: {"minimum": 0},
        }
        for parameter in parameters:
            parameter["schema"].update(bounds.get(parameter["name"], {}))
        return parameters
