"""The K controller: per domain, measure acceptance and cost, pick the K with the most tokens/s.

Model. Drafts are accepted token by token with probability α (per domain) until the first
rejection, so a verify step with K drafts yields E(K) = (1 − α^(K+1)) / (1 − α) tokens. With
n-gram drafting only a share ``c`` of steps has a draft at all, so a step yields
c·E(K) + (1 − c). A row decodes at rate = tokens per step / step time, and the step time grows
with K (more tokens to verify, a draft model's own passes) at a rate that depends on the batch
size: this is what makes speculation pay at small batches and lose at large ones.

Measurements. Each committed unit contributes its rows' acceptance histograms (α and c, pooled
per domain) and their running time (the rate at which its rows decoded at that K). A step time
per K follows from any domain measured at that K (tokens per step / rate), pooled across
domains, so a K measured on one domain informs every other. ``batchspec tune`` measures every
K of the grid on a sample of every domain; during a run, workers append their units to
``stats/<worker>.jsonl`` in the output directory and read each other's, so the estimates keep
improving with the run. Each domain's best K maximizes its predicted rate; a K is only ever
chosen from measured step times (interpolated between measured K, never assumed). Since vLLM
fixes K per engine, ``KPolicy.plan`` then weighs the domains' best K against engine starts
over the whole remaining work, and ``KPolicy.probe`` spends a little of it on measuring a K
nobody ran yet.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATS_DIR = "stats"
TUNING_FILE = "tuning.json"
MIN_RATE_TOKENS = 1500
"""Output tokens a (domain, K) pair needs before its own measured rate replaces the model."""


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens per verify step with K drafts at per-token acceptance α: (1 − α^(K+1))/(1 − α)."""
    if k <= 0:
        return 1.0
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


@dataclass
class Observation:
    """What a batch of rows of one domain at one K showed: the controller's only input."""

    domain: str | None
    k: int
    batch: int
    rows: int = 0
    output_tokens: int = 0
    running_s: float = 0.0
    """Sum over rows of the time from first scheduled to last token."""
    accepted: int = 0
    rejections: int = 0
    """Verify steps that rejected a draft (the geometric model's failures)."""
    spec_steps: int = 0
    decode_steps: int = 0
    """All steps after the first token: output tokens − 1 − accepted, per row."""

    def add_row(self, row: dict[str, Any]) -> None:
        """Add one output row (the writer's columns); error rows carry nothing."""
        tokens = row.get("num_output_tokens")
        if not tokens or row.get("error") is not None:
            return
        self.rows += 1
        self.output_tokens += tokens
        if row.get("e2e_s") is not None:
            self.running_s += row["e2e_s"] - row["queue_s"]
        accepted = row.get("num_accepted_tokens") or 0
        hist = row.get("acceptance_histogram") or []
        self.accepted += accepted
        self.rejections += sum(hist[:-1]) if hist else 0
        self.spec_steps += row.get("num_spec_steps") or 0
        self.decode_steps += max(tokens - 1 - accepted, 0)

    def merge(self, other: Observation) -> None:
        for name in (
            "rows",
            "output_tokens",
            "running_s",
            "accepted",
            "rejections",
            "spec_steps",
            "decode_steps",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class DomainModel:
    """Pooled acceptance of one domain, over every K it ran with."""

    accepted: int = 0
    rejections: int = 0
    spec_steps: int = 0
    decode_steps: int = 0

    @property
    def alpha(self) -> float:
        """Posterior mean of α under a uniform prior: (A + 1) / (A + R + 2)."""
        return (self.accepted + 1) / (self.accepted + self.rejections + 2)

    @property
    def alpha_std(self) -> float:
        a, b = self.accepted + 1, self.rejections + 1
        return math.sqrt(a * b / ((a + b) ** 2 * (a + b + 1)))

    @property
    def coverage(self) -> float:
        """Share of decode steps that had drafts (1 for draft models; less for n-gram)."""
        if self.decode_steps <= 0:
            return 1.0
        return min(1.0, self.spec_steps / self.decode_steps)

    def tokens_per_step(self, k: int) -> float:
        if k == 0:
            return 1.0
        c = self.coverage
        return c * expected_tokens(self.alpha, k) + (1.0 - c)


@dataclass
class Choice:
    """The controller's view of one domain, for decisions and reports."""

    domain: str | None
    k: int
    alpha: float | None
    alpha_std: float | None
    rates: dict[int, float] = field(default_factory=dict)
    """Predicted (or measured) decode rate per row, tokens/s, per K considered."""


class Controller:
    """Chooses K per domain from observations at one batch size."""

    def __init__(
        self, batch: int, k_grid: Iterable[int], default_k: int, fixed: dict[str, int] | None = None
    ):
        self.batch = batch
        self.k_grid = sorted(set(k_grid))
        self.default_k = default_k
        self.fixed = dict(fixed or {})
        """Per-domain K set by the user (speculative.per_domain): never changed."""
        self.obs: dict[tuple[str | None, int], Observation] = {}

    # -- input ---------------------------------------------------------------------------

    def add(self, ob: Observation) -> None:
        if ob.batch != self.batch or ob.rows == 0:
            return  # another batch size has other step costs
        key = (ob.domain, ob.k)
        if key not in self.obs:
            self.obs[key] = Observation(ob.domain, ob.k, ob.batch)
        self.obs[key].merge(ob)

    # -- estimates -----------------------------------------------------------------------

    def domain_model(self, domain: str | None) -> DomainModel:
        m = DomainModel()
        for (d, k), ob in self.obs.items():
            if d == domain and k > 0:
                m.accepted += ob.accepted
                m.rejections += ob.rejections
                m.spec_steps += ob.spec_steps
                m.decode_steps += ob.decode_steps
        return m

    def measured_rate(self, domain: str | None, k: int) -> float | None:
        ob = self.obs.get((domain, k))
        if ob is None or ob.running_s <= 0 or ob.output_tokens < MIN_RATE_TOKENS:
            return None
        return ob.output_tokens / ob.running_s

    def step_times(self) -> dict[int, float]:
        """Seconds per step at each measured K, pooled over domains (token-weighted)."""
        num: dict[int, float] = {}
        den: dict[int, float] = {}
        models = {d: self.domain_model(d) for d, _ in self.obs}
        for (d, k), ob in self.obs.items():
            if ob.running_s <= 0 or ob.output_tokens == 0:
                continue
            rate = ob.output_tokens / ob.running_s
            step = models[d].tokens_per_step(k) / rate
            num[k] = num.get(k, 0.0) + step * ob.output_tokens
            den[k] = den.get(k, 0.0) + ob.output_tokens
        return {k: num[k] / den[k] for k in sorted(num)}

    def _step_time(self, k: int, measured: dict[int, float]) -> float | None:
        """Measured, or interpolated linearly between the nearest measured K on both sides."""
        if k in measured:
            return measured[k]
        below = [x for x in measured if x < k]
        above = [x for x in measured if x > k]
        if not below or not above:
            return None
        lo, hi = max(below), min(above)
        return measured[lo] + (measured[hi] - measured[lo]) * (k - lo) / (hi - lo)

    def choose(self, domain: str | None) -> Choice:
        if domain is not None and domain in self.fixed:
            return Choice(domain, self.fixed[domain], None, None)
        model = self.domain_model(domain)
        steps = self.step_times()
        predicted: dict[int, float] = {}
        measured: dict[int, float] = {}
        for k in self.k_grid:
            step = self._step_time(k, steps)
            if step is not None:
                predicted[k] = model.tokens_per_step(k) / step
            rate = self.measured_rate(domain, k)
            if rate is not None:
                measured[k] = rate
        # Step times are pooled over domains, but a domain with long prompts steps slower at
        # every K, and its extra cost per draft differs too: the domain's own rates win where
        # it has them, and scale the model's level for the K it lacks.
        both = [k for k in measured if k in predicted]
        scale = sum(measured[k] for k in both) / sum(predicted[k] for k in both) if both else 1.0
        rates = dict(sorted(({k: r * scale for k, r in predicted.items()} | measured).items()))
        has_acceptance = model.accepted + model.rejections > 0
        if not rates or (not has_acceptance and not any(k == 0 for k in rates)):
            k = self.default_k
        else:
            k = max(rates, key=lambda x: (rates[x], -x))  # ties: the smaller K
        alpha = model.alpha if has_acceptance else None
        return Choice(domain, k, alpha, model.alpha_std if has_acceptance else None, rates)

    def rate(self, domain: str | None, k: int) -> float | None:
        return self.choose(domain).rates.get(k)

    # -- persistence ---------------------------------------------------------------------

    def load_observations(self, items: Iterable[dict[str, Any]]) -> None:
        for item in items:
            self.add(Observation(**item))


class SharedStats:
    """Observations shared through ``OUT/stats/<worker>.jsonl`` (append-only, one per unit)."""

    def __init__(self, out_dir: Path, worker: str):
        self.dir = out_dir / STATS_DIR
        self.path = self.dir / f"{worker}.jsonl"
        self._offsets: dict[Path, int] = {}

    def append(self, ob: Observation) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as fh:
            fh.write(json.dumps(asdict(ob)) + "\n")
        # Our own lines are added to the controller directly: skip them when reading.
        self._offsets[self.path] = self.path.stat().st_size

    def read_new(self) -> list[Observation]:
        """Observations appended by any worker since the last call (whole lines only)."""
        found = []
        if not self.dir.is_dir():
            return found
        for path in sorted(self.dir.glob("*.jsonl")):
            start = self._offsets.get(path, 0)
            with open(path, "rb") as fh:
                fh.seek(start)
                data = fh.read()
            end = data.rfind(b"\n") + 1
            for line in data[:end].splitlines():
                if line.strip():
                    found.append(Observation(**json.loads(line)))
            self._offsets[path] = start + end
        return found


def tuning_path(out_dir: Path) -> Path:
    return out_dir / TUNING_FILE


def write_tuning(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def read_tuning(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def tuning_observations(tuning: dict[str, Any], batch: int) -> list[dict[str, Any]]:
    """The tuning sweep's observations at this batch size (none if it was not swept)."""
    for entry in tuning.get("batches", []):
        if entry["batch"] == batch:
            return entry["observations"]
    return []


class KPolicy:
    """K per domain for one worker: the spec's fixed K, or the adaptive controller.

    The controller starts from the tuning file (if it was made for this method), takes every
    unit this worker commits, and every so often the units other workers shared.
    """

    def __init__(self, spec: Any, out_dir: Path, worker: str):
        s = spec.speculative
        self.spec = spec
        self.adaptive = s.adaptive and s.method != "none"
        self.ctl = Controller(
            spec.model.max_num_seqs, s.k_grid, s.num_speculative_tokens, fixed=s.per_domain
        )
        self.shared = SharedStats(out_dir, worker)
        self._taken: dict[str | None, tuple[int, int]] = {}
        """Per domain: units taken, and how many of them ran away from their planned K."""
        self.build_s: float | None = None
        """Seconds to start an engine, as last measured: what a switch of K costs."""
        tuning = read_tuning(tuning_path(out_dir)) if self.adaptive else None
        if tuning is not None and tuning.get("method") == s.method:
            self.ctl.load_observations(tuning_observations(tuning, spec.model.max_num_seqs))
            self.build_s = tuning.get("engine_build_s")
        self.refresh()

    def refresh(self) -> None:
        if self.adaptive:
            for ob in self.shared.read_new():
                self.ctl.add(ob)

    def observe(self, ob: Observation) -> None:
        if self.adaptive:
            self.ctl.add(ob)
            self.shared.append(ob)

    def plan(self, rows: dict[str | None, int], engine_k: int | None) -> dict[str | None, int]:
        """K per domain for the rows left, deciding at once which engines are worth building.

        Every domain at its own best K can need one engine per distinct K, and each engine
        beyond the one that is up costs a start. So over every set of K from the grid (a few
        dozen sets), the predicted time of the rows left, each domain at the fastest K of the
        set, plus the starts of the set's new engines; the cheapest set wins. Domains without
        predictions keep the controller's choice (the spec's K until measured), and so do
        domains with a fixed K. Until an engine start has been measured (here or by
        ``batchspec tune``) every domain gets its own best K: the first engine measures it.
        """
        if not self.adaptive:
            return {d: self.spec.speculative.k_for(d) for d in rows}
        choices = {d: self.ctl.choose(d) for d in rows}
        if self.build_s is None:
            return {d: c.k for d, c in choices.items()}
        forced = {d: c.k for d, c in choices.items() if d in self.ctl.fixed or not c.rates}
        free = {d: c.rates for d, c in choices.items() if d not in forced}
        if not free:
            return forced
        required = set(forced.values())
        best: tuple[float, dict[str | None, int]] | None = None
        grid = self.ctl.k_grid
        for n in range(1, len(grid) + 1):
            for ks in itertools.combinations(grid, n):
                engines = required | set(ks)
                new = len(engines - {engine_k}) if engine_k is not None else len(engines) - 1
                cost = new * self.build_s
                assign = dict(forced)
                for d, rates in free.items():
                    usable = [k for k in ks if k in rates]
                    if not usable:
                        break
                    k = max(usable, key=lambda x, r=rates: (r[x], -x))
                    assign[d] = k
                    cost += rows[d] * self.tokens_per_row(d) / (self.ctl.batch * rates[k])
                else:
                    if best is None or cost < best[0]:
                        best = (cost, assign)
        return {d: c.k for d, c in choices.items()} if best is None else best[1]

    def probe(
        self, rows: dict[str | None, int], plan: dict[str | None, int]
    ) -> tuple[str | None, int] | None:
        """A (domain, K) worth one unit on an engine of its own, to measure a K no unit has run.

        The plan only weighs K with a measured step time, so a run that starts at one K (no
        tuning file) would otherwise stay there. When the predicted time of the rows left is
        large enough that two engine starts (there and back) are at most ``explore`` of it,
        one unit of the domain with the most rows runs at an unmeasured grid neighbour of its
        planned K; the measurement then informs every domain's prediction at that K.
        """
        if not self.adaptive or self.build_s is None:
            return None
        measured = self.ctl.step_times()
        if not measured:
            return None
        left = 0.0
        for d, n in rows.items():
            rate = self.ctl.rate(d, plan[d])
            if rate:
                left += n * self.tokens_per_row(d) / (self.ctl.batch * rate)
        if 2 * self.build_s > self.spec.speculative.explore * left:
            return None
        grid = self.ctl.k_grid
        for d in sorted(rows, key=lambda x: -rows[x]):
            if d in self.ctl.fixed or plan[d] not in grid:
                continue
            i = grid.index(plan[d])
            for j in (i + 1, i - 1):
                if 0 <= j < len(grid) and grid[j] not in measured:
                    return d, grid[j]
        return None

    def tokens_per_row(self, domain: str | None) -> float:
        rows = tokens = 0
        for (d, _), ob in self.ctl.obs.items():
            if d == domain:
                rows += ob.rows
                tokens += ob.output_tokens
        return tokens / rows if rows else float(self.spec.sampling.max_tokens)

    def explores(self, domain: str | None, best: int, engine_k: int) -> bool:
        """Whether the next unit of this domain, planned at ``best``, should run at
        ``engine_k``, a grid neighbour, to keep measuring it: while fewer than ``explore`` of
        the domain's units this worker took ran away from their planned K."""
        if not self.adaptive or domain in self.ctl.fixed:
            return False
        grid = self.ctl.k_grid
        if best not in grid or engine_k not in grid:
            return False
        if abs(grid.index(best) - grid.index(engine_k)) != 1:
            return False
        took, explored = self._taken.get(domain, (0, 0))
        return explored < self.spec.speculative.explore * (took + 1)

    def taken(self, domain: str | None, explored: bool) -> None:
        """Count a unit the worker took, for the exploring quota."""
        took, n = self._taken.get(domain, (0, 0))
        self._taken[domain] = (took + 1, n + explored)
