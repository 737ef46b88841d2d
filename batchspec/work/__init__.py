"""One worker's run: leases, claiming, the scheduler (next unit and its K), the worker loop
that commits units, signal handling, and the per-invocation run logs."""
