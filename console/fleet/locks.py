"""Row locks of hosts and GPUs, after instances' (the order: accounts/locks.py): a host before
its GPUs, GPUs in primary-key order.

A host is locked FOR NO KEY UPDATE (its key never changes): rows that refer to it (an
allocation, an image it holds, an event) are still written meanwhile, as PostgreSQL's foreign
key checks take only a KEY SHARE lock of it. Under FOR UPDATE, a launch noting the image it runs
(its HostImage row inserted, then its foreign key checked) deadlocked with the host's heartbeat
(the host locked, then the same HostImage row inserted)."""

from console.fleet.models import Gpu, Host


def host(pk: int) -> Host:
    return Host.objects.select_for_update(no_key=True).get(pk=pk)


def gpus(pks) -> list[Gpu]:
    return list(Gpu.objects.select_for_update().filter(pk__in=pks).order_by("pk"))


def gpus_of(host: Host) -> list[Gpu]:
    return list(Gpu.objects.select_for_update().filter(host=host).order_by("pk"))


def gpu(pk: int) -> Gpu:
    return Gpu.objects.select_for_update().select_related("host", "model").get(pk=pk)
