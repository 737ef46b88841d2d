"""What every spec section shares: unknown keys and loosely typed values are errors, and how
the reference shows a default that is not a plain value."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


def _shown(default: str) -> dict[str, Any]:
    """How the reference shows a default that is not a plain value (computed, or vLLM's)."""
    return {"shown_default": default}


class _Section(BaseModel):
    """Base for every section: unknown keys are errors, not silently ignored; and values keep
    their YAML type (strict): ``max_tokens: true`` or ``temperature: yes`` is an error, not 1
    and 1.0. An integer still serves where a float is expected (``temperature: 1``). Every
    float is finite: YAML reads ``.inf`` and ``.nan`` as floats, and no key means anything by
    them (an infinite lease never expires, an infinite temperature samples nothing)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)
