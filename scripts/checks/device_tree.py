"""The tree engine on a GPU (issue 21), in about a minute, on a machine with torch and
transformers but no model weights, vLLM or polars: the embedded model's config and tokenizer
with random weights (logits sharpened), the same prompts at each batch size greedy (K=0, K=4
n-gram trees, K=4 draft-model trees: rows identical to K=0) and sampled (rows complete; the
seeded ones repeat). Exit 1 when a check fails. To carry to the device: ``--stage``'s files and
pydantic's wheels (pydantic, pydantic-core, annotated-types, typing-inspection).

    .venv/bin/python scripts/checks/device_tree.py --stage .device_check     # here, once
    python3 scripts/checks/device_tree.py --device cuda --files .device_check  # on the GPU
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
)
"""What the check needs of the embedded model: everything but its weights."""
PEAK = 12.0
DRAFT = {"method": "draft_model", "tree": {"max_depth": 3, "draft_layers": list(range(15))}}
"""Draft-model trees: the target's first 15 of 30 layers as the draft (a self-draft)."""
PROMPTS = [
    "Repeat after me three times: the quick brown fox jumps over the lazy dog.",
    "List the numbers from one to twenty, separated by commas.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Translate to French: The cat sleeps on the red chair. The dog sleeps on the red chair.",
    "Summarize: The meeting was moved to Tuesday. The meeting will now start at noon.",
    "Write a haiku about the sea.",
    "What is 17 times 23? Show the steps.",
    "Name five colors of the rainbow.",
]


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--files", type=Path, help="staged config and tokenizer (default: embedded)")
    ap.add_argument("--stage", type=Path, help="copy the embedded model's files there, exit")
    ap.add_argument("--batches", default="1,8", help="max_num_seqs of the runs")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--json", type=Path, help="write the table's rows there too")
    return ap.parse_args()


def embedded() -> Path:
    from batchspec.models import prepare

    return prepare("smollm2-135m-instruct")


def stage(dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    src = embedded()
    for name in FILES:
        if (src / name).exists():
            shutil.copy2(src / name, dest / name)
    size = sum(p.stat().st_size for p in dest.iterdir()) / 1e6
    print(f"staged {', '.join(sorted(p.name for p in dest.iterdir()))} ({size:.1f} MB) in {dest}")


def random_model(files: Path, dest: Path) -> Path:
    """A model directory: the staged config and tokenizer, random float32 weights."""
    import torch
    from safetensors.torch import save_file

    from batchspec.engines.tree.weights import llama_config, random_weights

    for name in FILES:
        if (files / name).exists():
            shutil.copy2(files / name, dest / name)
    cfg = llama_config(json.loads((dest / "config.json").read_text()))
    weights = random_weights(cfg, torch.float32, "cpu")
    # Logits x PEAK: next-token distributions as peaked as a trained model's. At HF's init
    # they are near uniform over 49k tokens: sampled rows would never repeat a token, and
    # n-gram trees would never draft.
    weights["model.norm.weight"] *= PEAK
    save_file({k: v.contiguous() for k, v in weights.items()}, str(dest / "model.safetensors"))
    return dest


def job(model_dir: Path, batch: int, max_tokens: int, sampled: bool, draft: bool) -> Any:
    from batchspec.spec import JobSpec

    sampling = {"temperature": 0.8, "top_p": 0.9} if sampled else {"temperature": 0.0}
    speculative = {"engine": "tree", "method": "ngram", "num_speculative_tokens": 4,
                   "adaptive": False, "tree": {"max_depth": 4}}  # fmt: skip
    return JobSpec.model_validate(
        {
            "name": "device_tree_check",
            "input": {"path": "unused.parquet", "prompt_column": "prompt"},
            "output": {"dir": "unused"},
            "model": {"model": str(model_dir), "dtype": "float32", "max_num_seqs": batch,
                      "max_model_len": 512},
            "speculative": {**speculative, **(DRAFT if draft else {})},
            "sampling": {**sampling, "max_tokens": max_tokens},
        }
    )  # fmt: skip


def run(spec: Any, k: int, prompts: list[list[int]]) -> dict[str, Any]:
    """One engine over the prompts (even rows seeded, odd rows on the engine's generator):
    the rows' token ids and the mean time of a verify step."""
    import torch

    from batchspec.engines.base import ListSource
    from batchspec.engines.tree.engine import TreeEngine
    from batchspec.units import RowRequest, UnitRequests, WorkUnit

    engine = TreeEngine(spec, k)
    device = str(engine.model.device)
    steps: list[float] = []
    real_step = engine._step

    def timed_step() -> None:  # ends on .item() syncs: wall time is the step's
        started = time.perf_counter()
        real_step()
        steps.append(time.perf_counter() - started)

    engine._step = timed_step  # type: ignore[method-assign]
    seeds = [1000 + i if i % 2 == 0 else None for i in range(len(prompts))]
    rows = [
        RowRequest(i, i, None, {}, p, seed=s)
        for i, (p, s) in enumerate(zip(prompts, seeds, strict=True))
    ]
    unit = WorkUnit(0, "unused.parquet", 0, len(rows), None, len(rows))
    started = time.perf_counter()
    results = [
        r
        for res in engine.run(ListSource([UnitRequests(unit, rows)]), lambda: False)
        for r in res.results
    ]
    seconds = time.perf_counter() - started
    engine.close()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    results.sort(key=lambda r: r.request.row)
    errors = [r.error for r in results if r.error]
    spec_rows = [r.spec for r in results if r.spec]
    return {
        "device": device,
        "tokens": [r.token_ids for r in results],
        "seeded": [r.token_ids for r, s in zip(results, seeds, strict=True) if s is not None],
        "errors": errors,
        "steps": len(steps),
        "ms_per_step": 1e3 * sum(steps) / max(len(steps), 1),
        "tok_s": sum(len(r.token_ids or []) for r in results) / seconds,
        "drafted": sum(s.drafted for s in spec_rows),
        "accepted": sum(s.accepted for s in spec_rows),
        "build_s": engine.build_s,
    }


RUNS = [
    ("greedy", "ngram", 0), ("greedy", "ngram", 4), ("greedy", "draft", 4),
    ("sampled", "ngram", 0), ("sampled", "ngram", 4), ("sampled", "draft", 4),
]  # fmt: skip
"""(mode, drafter, K) of the runs at each batch size; sampled K=4 n-gram runs twice."""


def check_batch(model_dir: Path, tokenizer: Any, batch: int, max_tokens: int) -> list[dict]:
    """Every run of ``RUNS`` and its check: greedy rows identical to K=0's, sampled rows
    complete (and the seeded ones repeat when the engine runs again)."""
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    runs = {}
    for mode, drafter, k in RUNS:
        spec = job(model_dir, batch, max_tokens, mode == "sampled", drafter == "draft")
        runs[(mode, drafter, k)] = run(spec, k, prompts)
    again = run(job(model_dir, batch, max_tokens, True, False), 4, prompts)
    out = []
    for (mode, drafter, k), r in runs.items():
        if mode == "greedy":
            plain = runs[("greedy", "ngram", 0)]["tokens"]
            same = sum(a == b for a, b in zip(r["tokens"], plain, strict=True))
            ok, verdict = same == len(prompts), f"{same}/{len(prompts)} rows = K=0"
        else:
            repeat = again["seeded"] == r["seeded"] if (drafter, k) == ("ngram", 4) else None
            ok = all(r["tokens"]) and not r["errors"] and repeat is not False
            verdict = (
                "completes"
                + {None: "", True: ", seeded rows repeat", False: ", seeded rows DIFFER"}[repeat]
            )
        mode = mode if k == 0 else f"{mode} {drafter}"
        out.append({"batch": batch, "mode": mode, "k": k, "ok": ok, "verdict": verdict, **r})
    return out


def table(rows: list[dict]) -> str:
    head = "batch | mode | K | device | rows | tokens | steps | ms/step | tok/s | accepted/drafted"
    lines = [f"| {head} | check |", "|---" * 11 + "|"]
    for r in rows:
        tokens = sum(len(t or []) for t in r["tokens"])
        acc = f"{r['accepted']}/{r['drafted']}" if r["k"] else "-"
        mark = "ok" if r["ok"] else "FAIL"
        lines.append(
            f"| {r['batch']} | {r['mode']} | {r['k']} | {r['device']} | {len(r['tokens'])} | "
            f"{tokens} | {r['steps']} | {r['ms_per_step']:.1f} | {r['tok_s']:.1f} | {acc} | "
            f"{mark}: {r['verdict']} |"
        )
    return "\n".join(lines)


def main() -> int:
    args = parse()
    sys.path.insert(0, str(ROOT))
    if args.stage is not None:
        stage(args.stage)
        return 0
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the engine takes the GPU when it sees one
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    from batchspec.models import load_tokenizer

    started = time.perf_counter()
    files = args.files or embedded()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = random_model(files, Path(tmp))
        built = time.perf_counter() - started
        tokenizer = load_tokenizer(model_dir, "model.tokenizer")
        for batch in (int(b) for b in args.batches.split(",")):
            rows += check_batch(model_dir, tokenizer, batch, args.max_tokens)
    name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(f"tree engine on {name}: torch {torch.__version__}, random-weight SmolLM2-135M "
          f"(float32; model dir built in {built:.1f} s), {len(PROMPTS)} prompts, "
          f"{args.max_tokens} tokens, wall {time.perf_counter() - started:.0f} s")  # fmt: skip
    print(table(rows))
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                [{k: v for k, v in r.items() if k not in ("tokens", "seeded")} for r in rows],
                indent=1,
            )
        )
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
