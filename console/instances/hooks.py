"""Who may stop a launch, in one place: the layers above instances register their checks here
in their AppConfig.ready(), and instances runs them without importing those layers.

A launch check (`LaunchCheck`) runs before a launch, start or resize that asks for more is
committed, inside its transaction, with the tenant: it refuses by raising a DomainError
(billing: a tenant that chose to stop at its budget and spent it).

A provision hold (`ProvisionHold`) is asked by the provision task before it calls the
instance's host, with the instance's primary key and the host it was placed on: True holds the
provisioning, and the hold queues `console.instances.tasks.provision` again itself once what it
waits for is done (snapshots: a shelved instance's disk restored on that host).

Registering is idempotent: the same function registered twice runs once (ready() may run more
than once in tests)."""

from collections.abc import Callable

from accounts.models import Tenant
from console.fleet.models import Host

LaunchCheck = Callable[[Tenant], None]
ProvisionHold = Callable[[int, Host], bool]

_launch_checks: list[LaunchCheck] = []
_provision_holds: list[ProvisionHold] = []


def register_launch_check(check: LaunchCheck) -> None:
    if check not in _launch_checks:
        _launch_checks.append(check)


def register_provision_hold(hold: ProvisionHold) -> None:
    if hold not in _provision_holds:
        _provision_holds.append(hold)


def launch_checks() -> tuple[LaunchCheck, ...]:
    return tuple(_launch_checks)


def provision_holds() -> tuple[ProvisionHold, ...]:
    return tuple(_provision_holds)


def check_launch(tenant: Tenant) -> None:
    """Run every launch check: the first that refuses raises."""
    for check in _launch_checks:
        check(tenant)


def provision_held(instance_pk: int, host: Host) -> bool:
    """Whether a provision hold holds the instance's provisioning on `host`. Every hold is
    asked, as each may start what it waits for."""
    return any([hold(instance_pk, host) for hold in _provision_holds])
