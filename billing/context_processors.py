"""Billing's notices on every console page (settings.TEMPLATES context_processors)."""

from billing.budgets import notices


def budget_notices(request) -> dict:
    """This month's budget alerts of the current tenant, highest first, for
    ``{% include "billing/_budget_notices.html" with notices=budget_notices %}``."""
    membership = getattr(request, "membership", None)
    if not membership:
        return {}
    return {"budget_notices": notices(membership.tenant)}
