"""PNG plots of a run for ``batchspec report --plots DIR``, drawn from one ``Scan``.

Everything plotted is already aggregated (per domain, per unit, histograms), so plotting a
10M-row output costs what its units and domains cost, not its rows. Time is the parts' commit
time (file mtime), relative to the first commit: a unit's rows count when it committed.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on a cluster node; set before pyplot loads

import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np
import polars as pl

from batchspec.observe.scan import LATENCY_EDGES, Scan

DPI = 110
MAX_PANELS = 24
"""Acceptance histograms: one panel per domain, for this many domains with most rows."""


def _name(domain: str | None) -> str:
    return "(none)" if domain is None else domain


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def acceptance_by_domain(table: pl.DataFrame, path: Path) -> Path:
    """Bars: pooled acceptance per domain, labelled with mean accepted length and K used."""
    rows = table.to_dicts()
    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * len(rows) + 2), 4.5))
    rates = [r["acceptance_rate"] or 0.0 for r in rows]
    bars = ax.bar(range(len(rows)), rates, color="tab:blue")
    for bar, r in zip(bars, rows, strict=True):
        length = r["mean_acceptance_length"]
        k = ",".join(map(str, r["k_used"] or [])) or "-"
        label = f"{length:.2f}\nK={k}" if length is not None else f"-\nK={k}"
        ax.annotate(
            label,
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
            xytext=(0, 2),
            textcoords="offset points",
        )
    ax.set_xticks(range(len(rows)), [_name(r["domain"]) for r in rows], rotation=30, ha="right")
    ax.set_ylim(0, 1.15)
    ax.set_ylabel("draft acceptance (accepted / drafted)")
    ax.set_title("Acceptance by domain\n(labels: mean tokens per verify step, K used)", fontsize=11)
    return _save(fig, path)


def _time_bins(units: list[dict]) -> tuple[float, np.ndarray]:
    """(first commit time, bin edges in seconds after it): about 40 bins, at least 5 s, and at
    least two typical gaps between commits wide: a short run of large units commits every
    minute or so, and narrower bins would draw each commit as a spike between empty bins."""
    times = np.sort(np.array([u["time"] for u in units]))
    t0 = float(times[0])
    span = max(float(times[-1]) - t0, 1.0)
    gap = float(np.median(np.diff(times))) if len(times) > 1 else 0.0
    width = max(5.0, span / 40, 2 * gap)
    return t0, np.arange(0.0, span + width, width)


def k_over_time(units: list[dict], path: Path) -> Path:
    """Heat map: per domain (rows) and time bin (columns), the mean K of the rows committed."""
    t0, edges = _time_bins(units)
    domains = sorted({u["domain"] for u in units}, key=lambda d: (d is None, d or ""))
    index = {d: i for i, d in enumerate(domains)}
    ksum = np.zeros((len(domains), len(edges) - 1))
    nrows = np.zeros_like(ksum)
    for u in units:
        b = min(int(np.searchsorted(edges, u["time"] - t0, side="right")) - 1, len(edges) - 2)
        ksum[index[u["domain"]], b] += (u["k"] or 0) * u["rows"]
        nrows[index[u["domain"]], b] += u["rows"]
    with np.errstate(invalid="ignore"):
        mean_k = np.where(nrows > 0, ksum / np.maximum(nrows, 1), np.nan)
    fig, ax = plt.subplots(figsize=(9, max(2.5, 0.35 * len(domains) + 1.5)))
    kmax = max(1, int(np.nanmax(mean_k)) if np.isfinite(mean_k).any() else 1)
    img = ax.imshow(
        mean_k,
        aspect="auto",
        interpolation="nearest",
        cmap="viridis",
        vmin=0,
        vmax=kmax,
        extent=(edges[0] / 60, edges[-1] / 60, len(domains) - 0.5, -0.5),
    )
    ax.set_yticks(range(len(domains)), [_name(d) for d in domains])
    ax.set_xlabel("minutes since the first commit")
    ax.set_title("K per domain over time (mean K of the rows committed; blank: none)")
    fig.colorbar(img, ax=ax, label="K (0 = no speculation)")
    return _save(fig, path)


def throughput_over_time(units: list[dict], path: Path) -> Path:
    """Output tokens/s (bars) and rows/s (line) committed per time bin."""
    t0, edges = _time_bins(units)
    rel = np.array([u["time"] - t0 for u in units])
    tokens, _ = np.histogram(rel, edges, weights=[u["output_tokens"] or 0 for u in units])
    rows, _ = np.histogram(rel, edges, weights=[u["rows"] for u in units])
    width = edges[1] - edges[0]
    minutes = edges / 60
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.stairs(tokens / width, minutes, fill=True, color="tab:blue", alpha=0.35)
    ax.set_xlabel("minutes since the first commit")
    ax.set_ylabel("output tokens/s (bars)", color="tab:blue")
    ax.set_ylim(bottom=0)
    ax2 = ax.twinx()
    ax2.stairs(rows / width, minutes, color="tab:orange", linewidth=2, linestyle="--")
    ax2.set_ylabel("rows/s (dashed line)", color="tab:orange")
    ax2.set_ylim(bottom=0)
    ax.set_title(f"Throughput over time (committed per {width:.0f} s)")
    return _save(fig, path)


def acceptance_histograms(scan: Scan, table: pl.DataFrame, path: Path) -> Path:
    """Per domain: the share of verify steps that accepted 0, 1, ..., K draft tokens."""
    order = [d for d in table["domain"].to_list() if d in scan.accept_hist][:MAX_PANELS]
    cols = min(3, max(1, len(order)))
    nrow = max(1, -(-len(order) // cols))
    fig, axes = plt.subplots(nrow, cols, figsize=(4 * cols, 2.8 * nrow), squeeze=False)
    for ax, domain in zip(axes.flat, order, strict=False):
        counts = scan.accept_hist[domain].astype(float)
        share = counts / counts.sum() if counts.sum() else counts
        ax.bar(range(len(share)), share, color="tab:green")
        ax.set_xticks(range(len(share)))
        ax.set_ylim(0, 1)
        ax.set_title(f"{_name(domain)} ({int(counts.sum())} steps)", fontsize=10)
        ax.set_xlabel("draft tokens accepted in a step")
        ax.set_ylabel("share of steps")
    for ax in list(axes.flat)[len(order) :]:
        ax.set_visible(False)
    if not order:
        axes.flat[0].set_visible(True)
        axes.flat[0].text(0.5, 0.5, "no speculative steps", ha="center", va="center")
    fig.suptitle("Acceptance histograms per domain")
    return _save(fig, path)


def latency(scan: Scan, path: Path) -> Path:
    """Per domain, the cumulative distribution of row latency (queued to last token)."""
    fig, ax = plt.subplots(figsize=(9, 4.5))
    lo, hi = len(LATENCY_EDGES), 0
    for domain, counts in sorted(scan.latency.items(), key=lambda kv: _name(kv[0])):
        nz = np.nonzero(counts)[0]
        if len(nz) == 0:
            continue
        lo, hi = min(lo, nz[0]), max(hi, nz[-1] + 1)
        cdf = np.cumsum(counts) / counts.sum()
        ax.stairs(cdf, LATENCY_EDGES, baseline=None, label=f"{_name(domain)} ({counts.sum()})")
    if hi > lo:
        ax.set_xlim(
            LATENCY_EDGES[max(lo - 20, 0)], LATENCY_EDGES[min(hi + 20, len(LATENCY_EDGES) - 1)]
        )
    for q in (0.5, 0.95):
        ax.axhline(q, color="grey", linewidth=0.8, linestyle=":")
        ax.annotate(
            f"p{int(q * 100)}",
            (0, q),
            xycoords=("axes fraction", "data"),
            fontsize=8,
            xytext=(2, 2),
            textcoords="offset points",
            color="grey",
        )
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    few_decades = hi > lo and (hi - lo) < 2 * 200
    minor = matplotlib.ticker.FormatStrFormatter("%g") if few_decades else None
    ax.xaxis.set_minor_formatter(minor or matplotlib.ticker.NullFormatter())
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("row latency, queued to last token (s, log scale)")
    ax.set_ylabel("share of rows at or below")
    ax.set_title("Latency distribution per domain (cumulative; legend: rows)")
    ax.legend(fontsize=8, loc="lower right")
    return _save(fig, path)


def write_plots(scan: Scan, table: pl.DataFrame, out_dir: Path) -> list[Path]:
    """Every plot as a PNG in ``out_dir`` (created); returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [acceptance_by_domain(table, out_dir / "acceptance_by_domain.png")]
    if scan.units:
        paths.append(k_over_time(scan.units, out_dir / "k_over_time.png"))
        paths.append(throughput_over_time(scan.units, out_dir / "throughput_over_time.png"))
    paths.append(acceptance_histograms(scan, table, out_dir / "acceptance_histograms.png"))
    paths.append(latency(scan, out_dir / "latency.png"))
    return paths
