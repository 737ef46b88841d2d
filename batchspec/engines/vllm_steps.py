"""vLLM's step cost, fitted from its own steps: what prices every K (K=0 included) on vLLM.

vLLM has no step profile, and measuring a K by running it costs an engine start (20-130 s
here) per K. But its engine core reports every step it runs when asked
(``enable_logging_iteration_details``): the rows in decode and their tokens, drafts included,
the prefill tokens, and the step's time. Batches fill and drain and n-gram drafts come in every
length from 0 to K, so one engine's own steps vary enough to fit

    seconds = a + b·rows + s·rows·[K > 0] + c·drafted + p·prefill

by least squares. A decode step of a full batch of B rows at any K' is then priced as
``a + b·B + s·B·[K' > 0] + c·B·fill·K'``, where ``fill`` is the share of draft slots the drafter
filled in the spec steps seen (n-gram finds no match on some rows). Two terms cannot always be
told apart, and are tied rather than guessed:

- ``s`` (a spec step's cost per row beyond a plain one's: the proposer, the rejection sampler)
  needs steps of both kinds; until a K=0 engine has run it is 0, so K=0 is priced as a spec step
  that drafted nothing, which overprices K=0 by the proposer's cost per row (measured in
  docs/choosing-k.md). That bias is toward speculation, and a K=0 engine, once run, removes it.
- ``c`` needs drafted tokens; on a K=0 engine alone a drafted token is priced as a prefill token
  (both are query tokens beyond a row's one decode token in the same forward).

The time of a step is the engine core's own: the period between two consecutive steps' outputs
(their ``timestamp``, on the core's monotonic clock), so it counts the scheduling and the
proposer as well as the forward, and not the worker's own work (an engine inside the worker's
process has it, as its clients do); periods that include a wait (far above what the fit so far
predicts for the step, ``IDLE_FACTOR``) are left out. Sums are kept, not steps:
memory is bounded whatever the run's length. The sums persist per machine, model, dtype and
method (under ``profiles/``, as the tree engine's profile), as a prior worth at most
``PRIOR_STEPS`` steps: a run starts priced, and its own steps soon outweigh another load's.
"""

from __future__ import annotations

import json
import os
import random
import threading
from pathlib import Path
from typing import Any

import numpy as np

from batchspec.engines.sums_fit import solve

FEATURES = ("step", "rows", "spec_rows", "drafted", "prefill")
"""The fit's columns: a constant per step, rows in decode, rows in decode on a speculative
engine, drafted tokens scheduled for verification, prefill tokens."""
MIN_STEPS = 20
"""Steps before the fit prices anything (fewer: NaN, no K is priced)."""
PRIOR_STEPS = 200
"""A cached fit from earlier runs counts as at most this many steps of this run's."""
IDLE_FACTOR = 3.0
"""A period longer than this times what the fit so far predicts for the step (plus ``IDLE_S``)
included a wait: for work (the core idle), or, with the engine in the worker's process, for
the worker's own work between steps (a commit). vLLM's own ``elapsed_ms`` cannot tell: on one
device it times the sampling alone, the forward having run before its clock starts."""
IDLE_S = 0.05
RECHECK = 32
"""Steps between refits of the fit that judges waits."""
SAMPLES = 256
"""Steps kept as they were (a uniform sample of all, reservoir-style) for ``report`` and checks
of the fit's form; the sums are what the fit uses."""


def decode_step_seconds(coef: np.ndarray, batch: float, k: int, drafts_per_row: float) -> float:
    """A decode step of ``batch`` rows at ``k`` (nothing in prefill) priced by the fit's
    coefficients (``FEATURES``), its rows drafting ``drafts_per_row`` tokens each."""
    spec = batch if k > 0 else 0.0
    return float(coef @ np.array([1.0, batch, spec, batch * drafts_per_row, 0.0]))


class StepCosts:
    """Running least-squares sums of (features, seconds) over an engine's steps, and the fit."""

    def __init__(self, key: str = "", path: Path | None = None):
        self.key, self.path = key, path
        n = len(FEATURES)
        self.xtx, self.xty, self.yy, self.n = np.zeros((n, n)), np.zeros(n), 0.0, 0.0
        self.per_k: dict[int, list[float]] = {}
        """Per engine K: steps, Σ seconds, Σ features (for measured against fitted)."""
        self.drafted_slots = np.zeros(2)
        """Over spec steps: drafted tokens, and the slots full drafts would fill (each row in
        decode its own K: rows × K where every row asks the step's K)."""
        self.slots_k: dict[int, list[float]] = {}
        """The same per step K."""
        self.skipped = 0
        """Periods left out as waits for work."""
        self.decode_rows = np.zeros(2)
        """This run's steps with rows in decode, and those rows (``rows``); not in the prior,
        which was another job's batch."""
        self.samples: list[list[float]] = []
        """Up to ``SAMPLES`` steps seen: K, rows, drafted, prefill, period (seconds)."""
        self._rng = random.Random(0)
        self._lock = threading.Lock()
        self._coef: np.ndarray | None = None
        self._sigma: np.ndarray | None = None
        self._prior_n = 0.0
        self._judge: np.ndarray | None = None
        """The fit that judges whether a period included a wait (refitted every ``RECHECK``)."""

    # -- input -------------------------------------------------------------------------

    def record(
        self,
        period_s: float,
        k: int,
        rows: int,
        tokens: int,
        prefill: int,
        slots: float | None = None,
    ) -> None:
        """One step of an engine at ``k``: its period, rows in decode and their tokens (drafts
        included), prefill tokens; ``slots``: the drafts its rows asked for where rows ask
        for different K (``vllm_live_k``: the step drafts at the largest), else rows × k."""
        if period_s <= 0 or rows + prefill == 0:
            return
        drafted = max(tokens - rows, 0)
        x = np.array([1.0, rows, rows if k > 0 else 0.0, drafted, prefill])
        judge = self._judge
        if judge is not None and period_s > IDLE_FACTOR * float(judge @ x) + IDLE_S:
            self.skipped += 1
            return
        with self._lock:
            self.xtx += np.outer(x, x)
            self.xty += x * period_s
            self.yy += period_s * period_s
            self.n += 1
            self.decode_rows += (1.0, rows) if rows else (0.0, 0.0)
            acc = self.per_k.setdefault(k, [0.0, 0.0, *([0.0] * len(FEATURES))])
            acc[0] += 1
            acc[1] += period_s
            for i, v in enumerate(x):
                acc[2 + i] += v
            if k > 0 and rows:
                asked = rows * k if slots is None else slots
                self.drafted_slots += (drafted, asked)
                at_k = self.slots_k.setdefault(k, [0.0, 0.0])
                at_k[0] += drafted
                at_k[1] += asked
            self._coef = None
            seen = int(self.n - self._prior_n)
            sample = [k, rows, drafted, prefill, period_s]
            if len(self.samples) < SAMPLES:
                self.samples.append(sample)
            elif (j := self._rng.randrange(seen)) < SAMPLES:
                self.samples[j] = sample
        if seen % RECHECK == 0:
            self._judge = self.coefficients()

    # -- the fit -------------------------------------------------------------------------

    def coefficients(self) -> np.ndarray | None:
        """The fitted seconds per feature (``FEATURES``), none negative; None before
        ``MIN_STEPS`` steps."""
        with self._lock:
            if self._coef is None and self.n >= MIN_STEPS:
                tied = self._tied()
                self._coef, self._sigma = solve(self.xtx, self.xty, self.yy, self.n, tied)
            return self._coef

    def _tied(self) -> dict[int, int | None]:
        """Columns that the steps seen cannot tell apart: dropped (None) or priced as another."""
        ks = {k for k, acc in self.per_k.items() if acc[0] > 0}
        tied: dict[int, int | None] = {}
        if 0 not in ks or not (ks - {0}):
            tied[FEATURES.index("spec_rows")] = None
        if not (ks - {0}):
            tied[FEATURES.index("drafted")] = FEATURES.index("prefill")
        return tied

    def fill(self, k: int | None = None) -> float:
        """The share of draft slots filled in the spec steps seen: at the engine K nearest
        ``k`` (a longer K fills a smaller share: n-gram matches run out), or over all (None);
        1 before any spec step."""
        ks = [j for j, (_, slots) in self.slots_k.items() if j > 0 and slots > 0]
        if k is None or not ks:
            drafted, slots = self.drafted_slots
            return float(drafted / slots) if slots > 0 else 1.0
        drafted, slots = self.slots_k[min(ks, key=lambda j: (abs(j - k), -j))]
        return float(drafted / slots)

    def drafts(self, k: int) -> float:
        """Drafts per row in a step at ``k``: ``fill(k)·k``, kept between what the K measured
        below and above it drafted (a chain allowed more drafts never drafts fewer; where the
        measurements disagree, the lower bound wins, so the price rises with K)."""
        if k <= 0:
            return 0.0
        seen = {j: a[0] / a[1] for j, a in self.slots_k.items() if j > 0 and a[1] > 0}
        lo = max((d * j for j, d in seen.items() if j <= k), default=0.0)
        hi = min((d * j for j, d in seen.items() if j >= k), default=np.inf)
        return max(lo, min(self.fill(k) * k, hi))

    def rows(self, batch: int) -> float:
        """The rows a decode step of this run carries on average, at most ``batch`` (the
        engine's ``max_num_seqs``), and ``batch`` before ``MIN_STEPS`` such steps: the batch
        K is priced at. On a GPU whose KV cache holds fewer long rows than ``max_num_seqs``
        allows, steps carry fewer, and at a smaller batch a draft costs a smaller share of
        the step's fixed cost than a full batch's price says."""
        steps, rows = self.decode_rows
        return min(float(batch), rows / steps) if steps >= MIN_STEPS else float(batch)

    def features(self, batch: float, k: int) -> np.ndarray:
        """A decode step of ``batch`` rows at ``k``, nothing in prefill."""
        drafted = batch * self.drafts(k)
        return np.array([1.0, batch, batch if k > 0 else 0.0, drafted, 0.0])

    def seconds_at(self, batch: float, k: int, fill: float) -> float:
        """Seconds of a decode step of ``batch`` rows at ``k`` that each draft ``fill``·k
        tokens (a domain's own drafts, ``Controller.fill_cost``; NaN before the fit)."""
        coef = self.coefficients()
        if coef is None:
            return float("nan")
        return decode_step_seconds(coef, batch, k, fill * k)

    def seconds(self, batch: float, k: int) -> float:
        """Seconds of a decode step of ``batch`` rows at ``k`` (NaN before the fit)."""
        coef = self.coefficients()
        if coef is None:
            return float("nan")
        return float(coef @ self.features(batch, k))

    def spread(self, batch: float, k: int) -> float:
        """The standard error of ``seconds`` (from the residuals; NaN before the fit)."""
        coef = self.coefficients()
        if coef is None or self._sigma is None:
            return float("nan")
        x = self.features(batch, k)
        return float(np.sqrt(max(x @ self._sigma @ x, 0.0)))

    def summary(self, batch: int, grid: list[int]) -> dict[str, Any]:
        """For the run's files and ``report``: the fit, its spread, and per engine K the
        measured mean step against the fitted mean of the same steps."""
        coef = self.coefficients()
        out: dict[str, Any] = {
            "steps": int(self.n - self._prior_n),
            "prior_steps": self._prior_n,
            "skipped": self.skipped,
            "fill": round(self.fill(), 4),
            "rows": self.rows(batch),
        }
        if coef is None:
            return out
        out["coefficients"] = dict(zip(FEATURES, (float(c) for c in coef), strict=True))
        rows = self.rows(batch)
        out["priced"] = {k: [self.seconds(rows, k), self.spread(rows, k)] for k in grid}
        measured = {}
        for k, acc in sorted(self.per_k.items()):
            n = acc[0]
            if n >= 1:
                mean_x = np.array(acc[2:]) / n
                measured[k] = {
                    "steps": n,
                    "measured_s": acc[1] / n,
                    "fitted_s": float(coef @ mean_x),
                }
        out["by_engine_k"] = measured
        out["samples"] = [list(x) for x in self.samples]
        return out

    # -- persistence ---------------------------------------------------------------------

    def load_prior(self) -> None:
        """Earlier runs' sums for this key, scaled to at most ``PRIOR_STEPS`` steps."""
        if self.path is None:
            return
        try:
            data = json.loads(self.path.read_text())
            xtx, xty = np.array(data["xtx"], float), np.array(data["xty"], float)
            yy, n = float(data["yy"]), float(data["n"])
            per_k = {int(k): [float(v) for v in acc] for k, acc in data["per_k"].items()}
            slots = np.array(data["drafted_slots"], float)
            slots_k = {int(k): [float(v) for v in x] for k, x in data.get("slots_k", {}).items()}
        except (OSError, ValueError, KeyError, TypeError):
            return
        if xtx.shape != self.xtx.shape or n <= 0:
            return
        w = min(1.0, PRIOR_STEPS / n)
        with self._lock:
            self.xtx += w * xtx
            self.xty += w * xty
            self.yy += w * yy
            self.n += w * n
            self._prior_n = w * n
            for k, acc in per_k.items():
                mine = self.per_k.setdefault(k, [0.0] * len(acc))
                for i, v in enumerate(acc):
                    mine[i] += w * v
            self.drafted_slots += w * slots
            for k, (drafted, asked) in slots_k.items():
                mine = self.slots_k.setdefault(k, [0.0, 0.0])
                mine[0] += w * drafted
                mine[1] += w * asked
            self._coef = None
        self._judge = self.coefficients()

    def save(self) -> None:
        """Write the sums atomically (an unwritable cache costs the next run its prior)."""
        if self.path is None or self.n - self._prior_n < MIN_STEPS:
            return
        with self._lock:
            data = {
                "key": self.key,
                "features": FEATURES,
                "xtx": self.xtx.tolist(),
                "xty": self.xty.tolist(),
                "yy": self.yy,
                "n": self.n,
                "per_k": {str(k): v for k, v in self.per_k.items()},
                "drafted_slots": self.drafted_slots.tolist(),
                "slots_k": {str(k): v for k, v in self.slots_k.items()},
                "samples": self.samples,
            }
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data))
            tmp.replace(self.path)
        except OSError:
            pass
