"""Pages of a list: `?limit=` (1 or more, default 50, at most 500 given) and `?offset=`.

DRF's LimitOffsetPagination quietly ignores a limit or offset it cannot read; a client that
typed `?offset=1O` deserves to hear about it, so here it is a 400 naming the parameter. And a
page that reaches the end of the list tells its count itself: most tenants' lists fit in one
page, and their request then makes no COUNT query."""

from rest_framework import pagination
from rest_framework.exceptions import ValidationError

from console import integers

MAX_LIMIT = 500
PAST_ANY_LIST = 2**62  # an offset beyond any list, whose slice no database integer could hold


def _whole_number(request, name: str, minimum: int, default: int | None) -> int | None:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        return integers.parse(raw, minimum=minimum)
    except integers.NotAWholeNumber as error:
        raise ValidationError({name: [str(error)]}) from None


class LimitOffsetPagination(pagination.LimitOffsetPagination):
    max_limit = MAX_LIMIT

    def get_limit(self, request):
        limit = _whole_number(request, self.limit_query_param, 1, self.default_limit)
        return min(limit, self.max_limit) if limit is not None else None

    def get_offset(self, request):
        return _whole_number(request, self.offset_query_param, 0, 0)

    def paginate_queryset(self, queryset, request, view=None):
        self.request = request
        self.limit = self.get_limit(request)
        if self.limit is None:
            return None
        self.offset = self.get_offset(request)
        rows = []
        if self.offset < PAST_ANY_LIST:
            rows = list(queryset[self.offset : self.offset + self.limit + 1])  # one more: the end?
        if 0 < len(rows) <= self.limit or (not rows and self.offset == 0):
            self.count = self.offset + len(rows)
        else:  # more follow, or the offset is past the end
            self.count = self.get_count(queryset)
        if self.count > self.limit and self.template is not None:
            self.display_page_controls = True
        return rows[: self.limit]

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.limit_query_param:
                parameter["schema"]["minimum"] = 1
                parameter["description"] = f"Results per page: a larger limit gives {MAX_LIMIT}."
            elif parameter["name"] == self.offset_query_param:
                parameter["schema"]["minimum"] = 0
        return parameters
