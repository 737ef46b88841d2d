"""The first code a process spawned by a starting engine runs (``procs.spawned_children_bound``
names this module as the parent's main module): bind it to its parent before vLLM imports."""

from batchspec.engines.procs import arm_spawned_child

arm_spawned_child()
