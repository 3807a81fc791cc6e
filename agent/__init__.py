"""gpucloud host agent: inventory, allocations and live metrics of one GPU host.

A standalone package: it imports nothing of the control plane.
"""

AGENT_VERSION = "0.1.0"
