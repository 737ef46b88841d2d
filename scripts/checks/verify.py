"""``batchspec verify`` in full on the default job: n-gram and draft-model speculation (the
target as its own draft), greedy in bfloat16 (float32 too) and sampled, each expected to pass,
and the planted broken sampler (every draft accepted, ``engines.planted``) greedy and sampled,
each expected to fail. One line of figures per configuration (docs/verify.md).

    .venv/bin/python scripts/checks/verify.py     # 24 greedy rows; 3 prompts x 200 samples
    .venv/bin/python scripts/checks/verify.py --rows 12 --samples 100 --only ngram

The planted bias patches the CLI's own vLLM, so those runs keep the engine in its process, in
float32 (vLLM 0.32 in one process fails an engine start after one of another dtype).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from harness import PLANTED, flags, job_file, options, parser, verify

DRAFT = {"method": "draft_model", "model": "builtin:smollm2-135m-instruct"}
CONFIGS = [
    ("ngram greedy bf16", {}, 0.0, "bfloat16", None),
    ("ngram sampled", {}, 1.0, "bfloat16", None),
    ("draft greedy bf16", DRAFT, 0.0, "bfloat16", None),
    ("draft sampled", DRAFT, 1.0, "bfloat16", None),
    ("ngram greedy planted", {}, 0.0, "float32", PLANTED),
    ("ngram sampled planted", {}, 1.0, "float32", PLANTED),
]
"""(name, speculative keys, temperature, dtype, environment of the planted bias or None)."""


def main() -> None:
    # --rows: greedy rows compared; --sampled-rows: prompts sampled; --max-tokens: the greedy
    # rows' length; --batch: max_num_seqs; --only: the configurations whose name starts so.
    ap = parser(__doc__, rows=24, sampled_rows=3, samples=200, tokens=4, max_tokens=64, batch=32)
    args = options(ap, only=None).parse_args()
    with tempfile.TemporaryDirectory() as name:
        for config, spec, temperature, dtype, env in CONFIGS:
            if args.only and not config.startswith(args.only):
                continue
            tmp = Path(name) / config.replace(" ", "_")
            sampling = {"temperature": temperature, "max_tokens": args.max_tokens}
            model = {"dtype": dtype, "max_num_seqs": args.batch}
            job = job_file(
                tmp.with_suffix(".yaml"), speculative=spec, model=model, sampling=sampling
            )
            rows = args.rows if temperature == 0 else args.sampled_rows
            extra = flags(rows=rows, samples=args.samples, tokens=args.tokens)
            _, line = verify(job, tmp, *extra, env=env, expected=int(env is not None))
            print(f"{config:24s} {line}", flush=True)


if __name__ == "__main__":
    main()
