"""Overhead of batchspec over bare vLLM (target >= 0.97): the same prompts, identical engine
settings, through ``run_job`` (Parquet in, chat template, continuous feeding, per-row metrics,
atomic parts out) and through ``vllm.LLM.generate`` on pre-tokenized prompts, ABBA rounds,
engine start and shutdown excluded from both, one-off imports paid before the first round.

    .venv/bin/python scripts/bench/overhead.py --rows 48 --rounds 2 --set sampling.max_tokens=64
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from harness import ROOT, abba, balanced, header, run_here


def bare_vllm(spec, df) -> dict:
    """Seconds in ``LLM.generate``, output tokens, texts in input order."""
    from vllm import LLM
    from vllm.inputs import TokensPrompt

    from batchspec.engines.vllm_args import engine_kwargs, sampling_params
    from batchspec.io.inputs import PromptBuilder
    from batchspec.models import load_tokenizer

    kwargs = engine_kwargs(spec, spec.speculative.num_speculative_tokens)
    tok = load_tokenizer(Path(kwargs.get("tokenizer", kwargs["model"])), "model.tokenizer")
    builder = PromptBuilder(spec.input, tok, 1 << 30, None)
    col = spec.input.messages_column or spec.input.prompt_column
    prompts = [TokensPrompt(prompt_token_ids=builder.encode(v)[0]) for v in df[col].to_list()]
    llm = LLM(**kwargs)
    started = time.perf_counter()
    outs = llm.generate(prompts, sampling_params(spec), use_tqdm=False)
    seconds = time.perf_counter() - started
    llm.llm_engine.engine_core.shutdown()
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"tok_s": tokens / seconds, "tokens": tokens, "seconds": seconds,
            "texts": [o.outputs[0].text for o in outs]}  # fmt: skip


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


def main() -> None:
    from batchspec.spec.file import load_spec

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--job", default=str(ROOT / "jobs" / "synth_data.yaml"))
    ap.add_argument("--rows", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()
    header()
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as name:
        tmp = Path(name)
        spec = load_spec(args.job, [*args.overrides, f"input.path={tmp / 'in.parquet'}"])
        df = balanced(load_spec(args.job, args.overrides), tmp / "in.parquet", rows=args.rows)
        order = df.with_row_index("i").sort(spec.input.id_column)["i"].to_list()
        s = spec.speculative
        print(f"job {args.job}: {df.height} prompts, {args.rounds} rounds, method {s.method} "
              f"K={s.num_speculative_tokens}, max_num_seqs {spec.model.max_num_seqs}, "
              f"max_tokens {spec.sampling.max_tokens}")  # fmt: skip
        print(f"one-off imports and tokenizer (paid once per process, outside every round): "
              f"{warm_up(spec):.1f} s")  # fmt: skip

        def run(config: str, r: int) -> dict:
            if config == "bare vLLM":
                return bare_vllm(spec, df)
            got = run_here(spec, tmp / f"out{r}")
            return got | {"texts": got["rows"].sort("id")["generated_text"].to_list()}

        def show(config: str, g: dict) -> str:
            return f"{g['tok_s']:.1f} tok/s ({g['tokens']} tok, {g['seconds']:.1f} s)"

        got = abba(["bare vLLM", "batchspec"], args.rounds, run, show)
    summary(got, order, df.height)


def summary(got: dict[str, list[dict]], order: list[int], rows: int) -> None:
    bs, bare = ([g["tok_s"] for g in got[c]] for c in ("batchspec", "bare vLLM"))
    ratios = [a / b for a, b in zip(bs, bare, strict=True)]
    for r, (a, b) in enumerate(zip(got["batchspec"], got["bare vLLM"], strict=True)):
        same = sum(x == b["texts"][i] for x, i in zip(a["texts"], order, strict=True))
        print(f"round {r + 1}: ratio {ratios[r]:.3f}, identical texts {same}/{rows}")
    first, second = ratios[1::2], ratios[::2]  # batchspec runs second in even rounds
    print(f"ratio of mean tok/s {statistics.mean(bs) / statistics.mean(bare):.3f}; per-round "
          f"ratio when batchspec ran first {statistics.mean(first) if first else float('nan'):.3f},"
          f" second {statistics.mean(second):.3f}")  # fmt: skip
    print(f"median: batchspec {statistics.median(bs):.1f} tok/s, bare vLLM "
          f"{statistics.median(bare):.1f} tok/s; per-round ratio median "
          f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}; "
          "target >= 0.97)")  # fmt: skip


if __name__ == "__main__":
    main()
