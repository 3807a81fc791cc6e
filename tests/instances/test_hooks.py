"""Who may stop a launch is registered in one place (console/instances/hooks.py)."""

from django.apps import apps

from billing.budgets import ensure_launch_allowed
from console.instances import hooks
from console.snapshots.services import hold_for_restore


def test_the_hooks_registered_at_start_are_billings_budget_and_snapshots_restore():
    assert hooks.launch_checks() == (ensure_launch_allowed,)
    assert hooks.provision_holds() == (hold_for_restore,)


def test_an_app_made_ready_again_registers_nothing_twice():
    apps.get_app_config("billing").ready()
    apps.get_app_config("snapshots").ready()
    assert hooks.launch_checks() == (ensure_launch_allowed,)
    assert hooks.provision_holds() == (hold_for_restore,)
