"""Which hosts can run an image: a host's driver reports the newest CUDA version it supports
(each GPU's cuda_version in its inventory), and an image built for a later CUDA fails there.
Placement does not look at images, so the operator is told when an image is added or changed."""

from dataclasses import dataclass, field

from console.catalog.models import GpuModel, cuda_tuple

# The fleet's status of a host that never runs anything again (console.fleet.models.Host,
# which this app sits below and reads through GpuModel.gpus).
RETIRED = "retired"


@dataclass
class CudaSupport:
    needed: str
    able: list[str] = field(default_factory=list)
    short: list[tuple[str, str]] = field(default_factory=list)  # (host, the CUDA it supports)
    unknown: list[str] = field(default_factory=list)  # hosts whose driver did not say

    def warning(self) -> str | None:
        """What the operator should know before tenants launch it; None when nothing."""
        if not self.needed:
            return None
        if not (self.able or self.short or self.unknown):
            return f"No host is registered yet: it needs a driver that supports CUDA {self.needed}."
        short = ", ".join(f"{host} (up to CUDA {cuda})" for host, cuda in self.short)
        if self.short and not self.able:
            return (
                f"No host can run CUDA {self.needed}: {short}. Its CUDA programs fail until a "
                "host's driver is upgraded."
            )
        if self.short:
            return (
                f"The drivers of {short} are older than CUDA {self.needed}: its CUDA programs fail "
                f"on those hosts. It runs on {', '.join(self.able)}."
            )
        return None

    def summary(self) -> str:
        if not self.needed:
            return "No CUDA: every host runs it."
        parts = []
        if self.able:
            parts.append(f"Runs on {', '.join(self.able)}.")
        parts.append(self.warning() or "")
        if self.unknown:
            parts.append(f"Unknown on {', '.join(self.unknown)} (its driver reports no CUDA).")
        return " ".join(part for part in parts if part)


def cuda_support(cuda_version: str) -> CudaSupport:
    """Which hosts in service can run an image built for ``cuda_version`` (empty: any)."""
    needed = cuda_tuple(cuda_version)
    if needed is None:
        return CudaSupport(needed="")
    support = CudaSupport(needed=cuda_version)
    best: dict[str, tuple[tuple[int, int] | None, str]] = {}
    rows = (
        GpuModel.objects.values_list("gpus__host__name", "gpus__host__status", "gpus__cuda_version")
        .order_by()
        .distinct()
    )
    for host, status, cuda in rows:
        if host is None or status == RETIRED:
            continue
        known = cuda_tuple(cuda)
        if host not in best or (known or (0, 0)) > (best[host][0] or (0, 0)):
            best[host] = (known, cuda)
    for host, (known, cuda) in sorted(best.items()):
        if known is None:
            support.unknown.append(host)
        elif known >= needed:
            support.able.append(host)
        else:
            support.short.append((host, cuda))
    return support
