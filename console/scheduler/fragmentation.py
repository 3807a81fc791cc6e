"""How fragmented a host is for the workload it should serve next.

After Weng et al., "Beware of Fragmentation" (USENIX ATC'23): a host's fragmentation is the
expected amount of its free GPU capacity (milli-GPU) that a request drawn from the workload
cannot use, and the best placement is the one that raises it the least. Three parts:

- per GPU: for each request shape of the GPU's mode with probability p, the free capacity
  left over once the GPU holds as many copies of that shape as fit (by milli and memory, or
  by MIG starts); all of it when the shape cannot use the GPU (another model or region).
  Shapes spanning several GPUs count the whole free capacity here, and ...
- per host: ... give back what their whole-GPU sets can use: the n-GPU shape uses
  n x floor(unused GPUs / n) of each kind (mode, model, memory);
- stranded: free GPU capacity the host's free vCPU and RAM cannot feed, expected over the
  workload's ratio classes (workload.RATIO_CLASSES): each class feeds GPUs at its own vCPU
  and RAM per milli-GPU.

The paper counts, per shape, the free capacity of GPUs that cannot take one more instance;
counting copies instead also sees what a GPU will have left once full (two 470s leave 60,
an 810 leaves 190). The paper's vCPU rule (a host that lacks the vCPU for a shape: all its
free capacity is fragment) becomes the smooth stranded part, which matters most: on the
default Alibaba trace (bench/scheduler.py) fgd leaves 7.8% of the GPUs unallocated with the
per-GPU parts alone and 4.1% with the stranded part (best-fit: 7.9%). Measured at the
workload's average ratio alone, a host that can feed the average request counts nothing
stranded, although its GPUs wait for vCPU-heavy requests it cannot feed: on the trace with
fractions of eleven sizes (each a mix of light and heavy requests), two classes leave 1.2%
unallocated where the average left 4.25% (best-fit: 8.3%).
"""

from collections import Counter
from collections.abc import Iterable

from console.scheduler.mig import max_instances
from console.scheduler.model import MIG, MIG_SLICES, MILLI, MILLI_PER_SLICE, SHARED, Gpu, Node
from console.scheduler.workload import Distribution

INFINITY = float("inf")

# A GPU state, as the index keys it: shared (free milli, free memory MiB, unused GPUs of its
# kind on the host if this one is unused else 0); whole (free GPUs of its model on the
# host,); MIG (used slice mask,). A GPU with nothing free has no state.
State = tuple[int, ...]


def is_unused(gpu: Gpu) -> bool:
    """A whole- or shared-mode GPU nobody holds any of (MIG GPUs never count)."""
    if gpu.mode == SHARED:
        return gpu.used_milli == 0 and gpu.used_memory_mib == 0
    return gpu.mode != MIG and not gpu.taken


def _kind(gpu: Gpu) -> tuple[str, str, int]:
    """Unused GPUs of one kind are interchangeable in a whole-GPU set."""
    return gpu.mode, gpu.model, gpu.memory_mib if gpu.mode == SHARED else 0


def unused_counts(gpus: Iterable[Gpu]) -> Counter[tuple[str, str, int]]:
    """How many unused GPUs of each kind (mode, model, memory of a shared GPU) there are."""
    return Counter(_kind(gpu) for gpu in gpus if is_unused(gpu))


def gpu_state(gpu: Gpu, unused: Counter[tuple[str, str, int]]) -> State | None:
    """The state of `gpu` on a host with `unused` GPUs; None when nothing of it is free."""
    if gpu.mode == SHARED:
        free = MILLI - gpu.used_milli
        memory = gpu.memory_mib - gpu.used_memory_mib
        return (free, memory, unused[_kind(gpu)] if is_unused(gpu) else 0) if free else None
    if gpu.mode == MIG:
        return (gpu.mig_used,) if gpu.mig_used != (1 << MIG_SLICES) - 1 else None
    return None if gpu.taken else (unused[_kind(gpu)],)


def state_units(mode: str, state: State) -> int:
    """Free milli-GPU of a GPU in `state`."""
    if mode == SHARED:
        return state[0]
    if mode == MIG:
        return MILLI_PER_SLICE * (MIG_SLICES - state[0].bit_count())
    return MILLI


def gpu_waste(mode: str, model: str, region: str, state: State, dist: Distribution) -> float:
    """Expected free milli-GPU of a GPU in `state` that the shapes of its mode leave over."""
    free = state_units(mode, state)
    waste = 0.0
    for shape, p in dist.shapes.get(mode, ()):
        fit = 0
        if shape.gpu_count == 1 and shape.accepts(model, region):
            if mode == SHARED:
                fit = free // shape.milli
                if shape.gpu_memory_mib:
                    fit = min(fit, state[1] // shape.gpu_memory_mib)
            elif mode == MIG:
                fit = max_instances(state[0], shape.mig_profile)
            else:
                fit = 1
        waste += p * (free - fit * shape.gpu_units)
    return waste


def sets_used(
    mode: str, model: str, region: str, unused: int, taken: int, dist: Distribution
) -> float:
    """How much less the host's multi-GPU sets give back when `taken` of its `unused` GPUs
    of `model` go: the rise of the per-host part (0 when no multi-GPU shape is expected)."""
    rise = 0.0
    for shape, p in dist.shapes.get(mode, ()):
        n = shape.gpu_count
        if n > 1 and shape.accepts(model, region):
            rise += p * n * MILLI * (unused // n - (unused - taken) // n)
    return rise


def fed(cpu_milli: int, ram_mib: int, cpu_per_unit: float, ram_per_unit: float) -> float:
    """Milli-GPU that `cpu_milli` and `ram_mib` can feed at one ratio class's ratios."""
    return min(
        cpu_milli / cpu_per_unit if cpu_per_unit else INFINITY,
        ram_mib / ram_per_unit if ram_per_unit else INFINITY,
    )


def stranded(free_units: int, cpu_milli: int, ram_mib: int, dist: Distribution) -> float:
    """Free milli-GPU that the free vCPU and RAM cannot feed, expected over the workload's
    ratio classes."""
    total = 0.0
    for share, cpu_per_unit, ram_per_unit in dist.ratios:
        # fed(), inlined: fgd calls this for every kind of host it looks at
        by_cpu = cpu_milli / cpu_per_unit if cpu_per_unit else INFINITY
        by_ram = ram_mib / ram_per_unit if ram_per_unit else INFINITY
        left = free_units - (by_cpu if by_cpu < by_ram else by_ram)
        if left > 0.0:
            total += share * left
    return total


def least_change(units: int, cpu_milli: int, ram_mib: int, dist: Distribution) -> float:
    """The most a placement of `units` milli-GPU that brings `cpu_milli` and `ram_mib` can
    lower a host's stranded part by (as a negative change): in each class, the units its vCPU
    and RAM do not feed themselves."""
    change = 0.0
    for share, cpu_per_unit, ram_per_unit in dist.ratios:
        left = units - fed(cpu_milli, ram_mib, cpu_per_unit, ram_per_unit)
        if left > 0.0:
            change -= share * left
    return change


def host_fragmentation(host: Node, dist: Distribution) -> float:
    """The whole measure for one host, from scratch (placement works with its changes)."""
    gpus = [g for g in host.gpus if g.healthy] if host.schedulable else []
    unused = unused_counts(gpus)
    total = 0.0
    free_units = 0
    for gpu in gpus:
        state = gpu_state(gpu, unused)
        if state is not None:
            total += gpu_waste(gpu.mode, gpu.model, host.region, state, dist)
            free_units += state_units(gpu.mode, state)
    for (mode, model, _), count in unused.items():
        total -= sets_used(mode, model, host.region, count, count, dist)
    return total + stranded(free_units, host.free_cpu_milli, host.free_ram_mib, dist)
