"""GPU backends: `sim` (simulated GPUs) and `nvml` (real GPUs through NVML).

Both answer `gpus()` (inventory entries), `sample(allocations)` (GPU, MIG and allocation
samples), `lost_gpus()`, and `ensure_mig` / `release_mig` for MIG allocations.
"""
