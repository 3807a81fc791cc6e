"""Row locks of hosts and GPUs, after instances' (the order: accounts/locks.py): a host before
its GPUs, GPUs in primary-key order."""

from console.fleet.models import Gpu, Host


def host(pk: int) -> Host:
    return Host.objects.select_for_update().get(pk=pk)


def gpus(pks) -> list[Gpu]:
    return list(Gpu.objects.select_for_update().filter(pk__in=pks).order_by("pk"))


def gpus_of(host: Host) -> list[Gpu]:
    return list(Gpu.objects.select_for_update().filter(host=host).order_by("pk"))


def gpu(pk: int) -> Gpu:
    return Gpu.objects.select_for_update().select_related("host", "model").get(pk=pk)
