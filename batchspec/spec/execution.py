"""The job's ``execution`` section, in a module of its own: how workers cooperate (leases,
heartbeats, retries, lingering, stalls, shutdown). None of it changes which rows are generated,
so the whole section is left out of the content hash (``keys.OUTPUT_NEUTRAL``)."""

from __future__ import annotations

from pydantic import Field, model_validator

from batchspec.spec.base import _Section


class ExecutionSpec(_Section):
    """How workers cooperate: none of it changes the output, so change it between runs freely."""

    lease_timeout_s: float = Field(
        300.0,
        gt=0,
        description="a lease not renewed for this long is taken over; a holder on the same "
        "host whose process is gone is taken over at once",
    )
    heartbeat_s: float = Field(
        20.0, gt=0, description="how often a worker renews its leases (at most half the timeout)"
    )
    max_unit_attempts: int = Field(
        3,
        ge=1,
        description="engine failures tolerated per unit before it is marked failed for this run",
    )
    linger_s: float = Field(
        300.0,
        ge=0,
        description="after its own work, how long a worker waits on units others still hold, "
        "to take over any they hand back or abandon; 0 = exit as soon as nothing is claimable",
    )
    engine_stall_s: float = Field(
        600.0,
        gt=0,
        description="an engine step that gives no output for this long (a wedged driver or "
        "collective call) kills the engine; its units are retried as after a crash",
    )
    shutdown_grace_s: float = Field(
        30.0,
        ge=0,
        description="on SIGTERM/SIGINT, time to finish units in flight before handing them "
        "back (keep it below Slurm's signal lead time)",
    )

    @model_validator(mode="after")
    def _beat_faster_than_timeout(self) -> ExecutionSpec:
        if self.heartbeat_s * 2 > self.lease_timeout_s:
            raise ValueError("heartbeat_s must be at most half of lease_timeout_s")
        return self
