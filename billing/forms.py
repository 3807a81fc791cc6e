from django import forms

from accounts.models import Quota


class BudgetForm(forms.ModelForm):
    """An owner's monthly budget and what happens when it is spent."""

    class Meta:
        model = Quota
        fields = ["monthly_budget", "budget_action"]
        labels = {"monthly_budget": "Monthly budget", "budget_action": "At 100% of the budget"}
        help_texts = {
            "monthly_budget": "Leave empty for no budget. Alerts go out at 50, 80 and 100%.",
        }
        widgets = {
            "monthly_budget": forms.NumberInput(attrs={"step": "0.01", "min": "0"}),
        }
