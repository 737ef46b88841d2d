"""The first code a process spawned by a starting engine runs (``tether`` names this module
as the parent's main module): bind it to its parent before vLLM imports."""

from batchspec.engines.tether import arm_spawned_child

arm_spawned_child()
