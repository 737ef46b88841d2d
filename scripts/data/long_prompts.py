"""Build the long-context prompt set, ``jobs/data/prompts_long.parquet``, from material on this
machine: the default set's own texts (``jobs/data/prompts.jsonl``) and Python's standard-library
documentation (module and function docstrings of the interpreter that runs this script).

Why: the default set's prompts are short (tens of tokens of context). Users' batches are often
retrieval QA and summarization over contexts of hundreds of tokens, where n-gram drafts copy
from the context and speculation pays, while on short chat and math prompts it may not. A set
that mixes both makes the domains disagree about K, which is what the per-domain K controller
is for (``scripts/bench/k_choice.py`` measures it here). Two long domains join the six short
ones (the default set's first ``--short`` rows of each, unchanged), so that a third of the rows
have a ~750-token context:

- ``long_qa`` (retrieval QA): each of the default set's ``qa`` prompts, its passage replaced by
  numbered documents (the passage among others from the default set and the stdlib docs, in a
  seeded order) that fill the context to ``--tokens``; the authored question is kept, so the
  answer is in exactly one document.
- ``long_summarization``: alternately a digest of several of the default set's passages
  ("summarize each article") and one stdlib module's documentation (its docstring and its
  public functions'), each filled to ``--tokens``.

Token counts are the embedded model's tokenizer's. The output is deterministic (seeded by row
number, rows sorted by id) for a given Python version; ``source`` is ``authored-v1`` on short
rows and ``long-v1`` on long ones::

    .venv/bin/python scripts/data/build.py long          # writes the Parquet file
    .venv/bin/python scripts/data/build.py long --check  # exit 1 if it differs
"""

from __future__ import annotations

import importlib
import inspect
import random
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
from build import CHAT_SCHEMA, DOMAINS, prompts

SOURCE = "long-v1"
LONG_ROWS = 60
"""Rows per long domain: one per default ``qa`` prompt (60), as many summaries."""
MODULES = ("base64", "configparser", "dataclasses", "difflib", "email.utils", "fileinput",
           "hashlib", "inspect", "json", "locale", "logging", "os", "os.path", "re", "shelve",
           "shutil", "socketserver", "statistics", "subprocess", "tempfile", "urllib.parse",
           "uuid")  # fmt: skip
"""Standard-library modules whose documentation serves as long text (each has more than 750
tokens of docstrings)."""
DIGEST_ASKS = (
    "Summarize each of the following articles in one sentence.",
    "Here are several short articles. Write a brief summary of each one.",
    "Read the articles below and give the main point of each in a single sentence.",
    "Write a one-line summary for every article below, in order.",
)
DOCS_ASKS = (
    "Here is the documentation of a Python module. Summarize what the module is for and "
    "describe its main functions for a new user.",
    "Read this Python documentation and write a short overview of it: what problem the module "
    "solves and how to use it.",
    "Summarize the documentation below in a few sentences, then list its most important functions.",
)
ADDRESS = re.compile(r" at 0x[0-9a-f]+")
LABEL = re.compile(r"^(passage|text|context|article)\s*:\s*", re.IGNORECASE)


def passage_index(text: str) -> int:
    """The paragraph of a prompt that holds its passage: the one with the most words."""
    paragraphs = text.split("\n\n")
    return max(range(len(paragraphs)), key=lambda i: len(paragraphs[i].split()))


def passages(rows: list[dict[str, Any]]) -> list[str]:
    """The distinct passages of the default set's qa and summarization prompts, in id order."""
    seen: dict[str, None] = {}
    for r in rows:
        if r["domain"] in ("qa", "summarization"):
            text = r["messages"][-1]["content"]
            body = text.split("\n\n")[passage_index(text)]
            seen.setdefault(LABEL.sub("", body).strip().strip('"'), None)
    return list(seen)


def module_docs(name: str) -> list[str]:
    """A stdlib module's documentation as paragraphs: its docstring, then each public
    function's signature and docstring, in name order."""
    module = importlib.import_module(name)
    parts = [p for p in (inspect.getdoc(module) or "").split("\n\n") if p.strip()]
    for attr in sorted(getattr(module, "__all__", dir(module))):
        obj = getattr(module, attr, None)
        if attr.startswith("_") or not inspect.isfunction(obj) or not inspect.getdoc(obj):
            continue
        try:
            signature = str(inspect.signature(obj))
        except (TypeError, ValueError):
            signature = "(...)"
        # Defaults that are objects print their memory address: not deterministic.
        signature = ADDRESS.sub("", signature)
        parts.append(f"{name}.{attr}{signature}\n{inspect.getdoc(obj)}")
    return parts


class Filler:
    """Picks pieces of text until they reach a token budget (the embedded model's tokenizer
    counts), skipping pieces that would pass it by more than ``SLACK`` tokens."""

    SLACK = 30

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self._counts: dict[str, int] = {}

    def count(self, text: str) -> int:
        if text not in self._counts:
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            self._counts[text] = len(ids)
        return self._counts[text]

    def fill(self, pieces: list[str], budget: int, first: bool = False) -> list[str]:
        """Pieces in order, as many as ``budget`` takes (the first always, if ``first``)."""
        out: list[str] = []
        used = 0
        for text in pieces:
            n = self.count(text) + 4  # the label and blank line around each piece
            if used + n <= budget + self.SLACK or (first and not out):
                out.append(text)
                used += n
            if used >= budget - self.SLACK:
                break
        return out


def long_qa(row: dict[str, Any], n: int, pool: list[str], filler: Filler, tokens: int) -> dict:
    """A default qa prompt with its passage hidden among other documents (seeded by ``n``)."""
    rng = random.Random(f"long_qa-{n}")
    text = row["messages"][-1]["content"]
    paragraphs = text.split("\n\n")
    at = passage_index(text)
    passage = LABEL.sub("", paragraphs[at]).strip()
    rest = filler.count("\n\n".join([*paragraphs[:at], passage, *paragraphs[at + 1 :]]))
    others = [p for p in pool if p[:60] not in passage]
    rng.shuffle(others)
    docs = filler.fill(others, tokens - rest)
    docs.insert(rng.randrange(len(docs) + 1), passage)
    numbered = "\n\n".join(f"Document {i}:\n{d}" for i, d in enumerate(docs, 1))
    user = "\n\n".join([*paragraphs[:at], "Documents:\n\n" + numbered, *paragraphs[at + 1 :]])
    return _row(row["messages"][:-1], user, f"long_qa-{n:04d}", "long_qa")


def long_summary(
    n: int, pool: list[str], docs: dict[str, list[str]], filler: Filler, tokens: int
) -> dict[str, Any]:
    """A digest of default-set passages (even ``n``) or one module's documentation (odd)."""
    rng = random.Random(f"long_summarization-{n}")
    system = [
        {"role": "system", "content": "You are a helpful assistant that writes clear summaries."}
    ]
    if n % 2 == 0:
        ask = rng.choice(DIGEST_ASKS)
        chosen = filler.fill(rng.sample(pool, len(pool)), tokens - filler.count(ask))
        body = "\n\n".join(f"Article {i}:\n{t}" for i, t in enumerate(chosen, 1))
    else:
        module = MODULES[(n // 2) % len(MODULES)]
        ask = f"{rng.choice(DOCS_ASKS)}\n\nDocumentation of the {module} module:"
        # Paragraph by paragraph (a function's docstring may be long), so that the budget fills.
        paragraphs = [q for p in docs[module] for q in p.split("\n\n") if q.strip()]
        start = rng.randrange(len(paragraphs) // 3) if n // 2 >= len(MODULES) else 0
        chosen = filler.fill(
            paragraphs[start:] + paragraphs[:start], tokens - filler.count(ask), first=True
        )
        body = "\n\n".join(chosen)
    return _row(system, f"{ask}\n\n{body}", f"long_summarization-{n:04d}", "long_summarization")


def _row(history: list[dict[str, str]], user: str, rid: str, domain: str) -> dict[str, Any]:
    messages = [*history, {"role": "user", "content": user}]
    return {"id": rid, "domain": domain, "prompt": user, "messages": messages, "source": SOURCE}


def tokenizer() -> Any:
    """The embedded model's tokenizer: what token counts are counted in."""
    from batchspec.models import load_tokenizer, resolve_model

    return load_tokenizer(resolve_model("builtin:smollm2-135m-instruct", "model"), "model")


def build(jsonl: Path, short: int, tokens: int) -> pa.Table:
    """The long-context set: ``short`` default rows per short domain, then the long ones."""
    filler = Filler(tokenizer())
    rows = prompts(jsonl).to_pylist()  # the default set, checked, by id
    out = []
    for domain in DOMAINS:  # the first ``short`` of each, unchanged
        out += [r for r in rows if r["domain"] == domain][:short]
    pool = passages(rows)
    docs = {m: module_docs(m) for m in MODULES}
    # Whole function docs (signature and docstring) of moderate length as retrieval documents.
    doc_pool = [
        p for m in MODULES for p in docs[m] if p.startswith(f"{m}.") and 40 <= len(p.split()) <= 160
    ]
    qa_rows = [r for r in rows if r["domain"] == "qa"]
    for n, row in enumerate(qa_rows[:LONG_ROWS], 1):
        out.append(long_qa(row, n, pool + doc_pool, filler, tokens))
    for n in range(1, LONG_ROWS + 1):
        out.append(long_summary(n, pool, docs, filler, tokens))
    out.sort(key=lambda r: r["id"])
    return pa.Table.from_pylist(out, schema=CHAT_SCHEMA)


def describe(table: pa.Table) -> str:
    """Rows per domain and the long rows' prompt lengths in tokens (min/median/max)."""
    count = tokenizer()
    lengths: dict[str, list[int]] = {}
    for d, p in zip(table["domain"].to_pylist(), table["prompt"].to_pylist(), strict=True):
        lengths.setdefault(d, []).append(len(count(p, add_special_tokens=False)["input_ids"]))
    lines = []
    for d, ls in sorted(lengths.items()):
        ls.sort()
        lines.append(f"  {d}: {len(ls)} rows, prompt tokens {ls[0]}/{ls[len(ls) // 2]}/{ls[-1]}")
    return "\n".join(lines)
