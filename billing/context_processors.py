"""Billing's notices on every console page (settings.TEMPLATES context_processors)."""

from billing.budgets import notice


def budget_notices(request) -> dict:
    """The budget banner of the current member (``budgets.notice``: the current budget and
    spend, unless dismissed at this level), for
    ``{% include "billing/_budget_notices.html" with notice=budget_notice %}``."""
    membership = getattr(request, "membership", None)
    if not membership:
        return {}
    return {"budget_notice": notice(membership)}
