"""Development tooling: what `make run`'s supervisor (console/launcher.py), the tests and the
benches use to stand up a container engine on this machine. A GPU host runs none of it, so the
agent's wheel (agent/pyproject.toml) leaves this package out, and nothing the agent's program
imports may need it.
"""
