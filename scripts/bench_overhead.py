"""Overhead of batchspec over bare vLLM: the same prompts, identical engine settings.

Each round runs the prompts once through ``batchspec run``'s code path (``run_job``: Parquet in,
chat template, continuous feeding, per-row metrics, atomic Parquet parts out) and once through
bare ``vllm.LLM.generate`` on pre-tokenized prompts, alternating which goes first. Engine start
and shutdown are excluded from both; everything batchspec does besides them counts against it.
Prints output tokens/s per round, each round's ratio (the two runs of a round share the machine's
state of the moment), the ratio by which side ran first, and the median ratio (target: >= 0.97).
One-off costs (imports, the tokenizer) are paid once before the first round.

    .venv/bin/python scripts/bench_overhead.py                    # default job, 96 prompts
    .venv/bin/python scripts/bench_overhead.py --rows 48 --rounds 2 --set sampling.max_tokens=64
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import polars as pl

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

ROOT = Path(__file__).resolve().parents[1]


def subset(spec, rows: int, path: Path) -> pl.DataFrame:
    """``rows`` prompts spread evenly over the domains, written where the job will read them."""
    df = pl.concat([pl.read_parquet(f) for f in spec.input_files()])
    dom = spec.input.domain_column
    if dom:
        per = max(1, rows // df[dom].n_unique())
        df = df.group_by(dom, maintain_order=True).head(per)
    df = df.head(rows)
    df.write_parquet(path)
    return df


def bare_vllm(spec, df: pl.DataFrame) -> tuple[float, int, list[str]]:
    """Seconds in ``LLM.generate``, output tokens, texts in input order."""
    from transformers import AutoTokenizer
    from vllm import LLM
    from vllm.inputs import TokensPrompt

    from batchspec.engines.vllm_engine import engine_kwargs, sampling_params
    from batchspec.io.inputs import PromptBuilder

    kwargs = engine_kwargs(spec, spec.speculative.num_speculative_tokens)
    tok = AutoTokenizer.from_pretrained(kwargs.get("tokenizer", kwargs["model"]))
    builder = PromptBuilder(spec.input, tok, 1 << 30, None)
    col = spec.input.messages_column or spec.input.prompt_column
    prompts = [TokensPrompt(prompt_token_ids=builder.encode(v)[0]) for v in df[col].to_list()]
    llm = LLM(**kwargs)
    started = time.perf_counter()
    outs = llm.generate(prompts, sampling_params(spec), use_tqdm=False)
    seconds = time.perf_counter() - started
    llm.llm_engine.engine_core.shutdown()
    del llm
    return (
        seconds,
        sum(len(o.outputs[0].token_ids) for o in outs),
        [o.outputs[0].text for o in outs],
    )


def warm_up(spec) -> float:
    """Import what both paths import and load the tokenizer once, before any round: a job
    pays these once per process, and round 1 would otherwise carry them for one side only."""
    from batchspec.engines.vllm_args import engine_kwargs
    from batchspec.models import load_tokenizer

    started = time.perf_counter()
    import vllm  # noqa: F401

    kwargs = engine_kwargs(spec, spec.speculative.num_speculative_tokens)
    load_tokenizer(Path(kwargs.get("tokenizer", kwargs["model"])), "model.tokenizer")
    return time.perf_counter() - started


def batchspec_run(spec, out_dir: Path) -> tuple[float, int, list[str]]:
    """Seconds of ``run_job`` less engine start and shutdown, output tokens, texts by id."""
    from batchspec.work.worker import run_job

    run_spec = spec.model_copy(
        update={"output": spec.output.model_copy(update={"dir": str(out_dir)})}
    )
    stats = run_job(run_spec, progress=False)
    seconds = stats.wall_s - stats.engine_build_s - stats.engine_close_s
    out = pl.read_parquet(out_dir / "parts" / "*.parquet")
    return seconds, stats.output_tokens, out.sort("id")["generated_text"].to_list()


def main() -> None:
    from batchspec.spec.file import load_spec

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--job", default=str(ROOT / "jobs" / "synth_data.yaml"))
    ap.add_argument("--rows", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp_name:
        tmp = Path(tmp_name)
        spec = load_spec(args.job, [*args.overrides, f"input.path={tmp / 'in.parquet'}"])
        base = load_spec(args.job, args.overrides)
        df = subset(base, args.rows, tmp / "in.parquet")
        id_col = spec.input.id_column
        order = df.with_row_index("i").sort(id_col)["i"].to_list()
        print(
            f"job {args.job}: {df.height} prompts, {args.rounds} rounds, "
            f"method {spec.speculative.method} K={spec.speculative.num_speculative_tokens}, "
            f"max_num_seqs {spec.model.max_num_seqs}, max_tokens {spec.sampling.max_tokens}"
        )
        print(f"one-off imports and tokenizer (paid once per process, outside every round): "
              f"{warm_up(spec):.1f} s")  # fmt: skip
        bs_tps, bare_tps, ratios = [], [], []
        for r in range(args.rounds):
            results = {}
            runs = [
                ("bare", lambda: bare_vllm(spec, df)),
                ("batchspec", lambda r=r: batchspec_run(spec, tmp / f"out{r}")),
            ]
            for name, fn in runs if r % 2 else runs[::-1]:
                results[name] = fn()
            (bs_s, bs_tok, bs_text), (bare_s, bare_tok, bare_text) = (
                results["batchspec"],
                results["bare"],
            )
            bs_tps.append(bs_tok / bs_s)
            bare_tps.append(bare_tok / bare_s)
            ratios.append(bs_tps[-1] / bare_tps[-1])
            same = sum(a == bare_text[i] for a, i in zip(bs_text, order, strict=True))
            print(
                f"round {r + 1}: batchspec {bs_tps[-1]:.1f} tok/s ({bs_tok} tok, {bs_s:.1f} s)  "
                f"bare vLLM {bare_tps[-1]:.1f} tok/s ({bare_tok} tok, {bare_s:.1f} s)  "
                f"ratio {bs_tps[-1] / bare_tps[-1]:.3f}  identical texts {same}/{df.height}"
            )
        second = [x for r, x in enumerate(ratios) if r % 2]  # rounds where batchspec ran second
        first = [x for r, x in enumerate(ratios) if not r % 2]
        print(
            f"ratio of mean tok/s {statistics.mean(bs_tps) / statistics.mean(bare_tps):.3f}; "
            f"per-round ratio when batchspec ran first {statistics.mean(first):.3f}, "
            f"second {statistics.mean(second) if second else float('nan'):.3f}"
        )
        print(
            f"median: batchspec {statistics.median(bs_tps):.1f} tok/s, bare vLLM "
            f"{statistics.median(bare_tps):.1f} tok/s; per-round ratio median "
            f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}; "
            "target >= 0.97)"
        )


if __name__ == "__main__":
    main()
