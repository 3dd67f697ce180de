"""How a process runs and holds up: its settings (read once at the composition root), the clock,
background workers with a bounded stop, cooperative time slices on the event loop, retries and
circuit breakers, the tenants' fair-share budgets (quotas) and how the process keeps its memory.
Nothing here imports another group of ``shared``."""
