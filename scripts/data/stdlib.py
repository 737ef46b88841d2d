"""The held-out set, ``stdlib.parquet``: prompts built from text nobody on the project wrote or
tuned on, the Python standard library's own (issue 35's T2b: "a mixed-domain set the benchmark
did not tune on, built from other sources"). Passages of the language reference
(``pydoc_data.topics``, what ``help("assert")`` prints) to summarise, answer from and chat
about; the source of small pure-Python stdlib functions to explain, document and test. Six
domains of 24 rows, deterministic for a Python minor version (3.11 built the shipped file).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import random
import textwrap

import pyarrow as pa

MODULES = ("textwrap", "posixpath", "shlex", "fnmatch", "colorsys", "statistics", "heapq",
           "string", "html", "calendar", "difflib", "glob", "ipaddress", "quopri", "base64",
           "fractions", "datetime", "urllib.parse", "email.utils", "json.encoder")  # fmt: skip
"""Where the functions come from: pure-Python modules of the standard library."""

ROWS = 24


def passages(rng: random.Random, count: int) -> list[tuple[str, str]]:
    """``count`` (title, passage) pairs from the language reference: a topic's paragraphs from
    its start up to ~1,200 characters, topics drawn without replacement."""
    from pydoc_data.topics import topics

    out = []
    for key in rng.sample(sorted(topics), count):
        lines = topics[key].strip().splitlines()
        title, body = lines[0].strip(), "\n".join(lines[2:]).strip()
        kept = ""
        for para in body.split("\n\n"):
            if kept and len(kept) + len(para) > 1200:
                break
            kept = f"{kept}\n\n{para}" if kept else para
        out.append((title, kept[:1600]))
    return out


def functions(rng: random.Random, count: int) -> list[tuple[str, str]]:
    """``count`` (source, source without its docstring) pairs: module-level functions of
    ``MODULES`` of 6-30 lines with a docstring, drawn without replacement."""
    found = []
    for name in MODULES:
        module = importlib.import_module(name)
        for _, fn in sorted(inspect.getmembers(module, inspect.isfunction)):
            if fn.__module__ != module.__name__ or fn.__doc__ is None:
                continue
            try:
                source = textwrap.dedent(inspect.getsource(fn))
            except OSError:  # made by exec (e.g. dataclasses'), no file to read
                continue
            if 6 <= source.count("\n") <= 30:
                found.append((source, _without_docstring(source)))
    return rng.sample(found, count)


def _without_docstring(source: str) -> str:
    """The function's source less its docstring's lines."""
    node = ast.parse(source).body[0]
    doc = node.body[0]
    lines = source.splitlines(keepends=True)
    return "".join(lines[: doc.lineno - 1] + lines[doc.end_lineno :])


def _turns(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def build(rows: int = ROWS) -> pa.Table:
    """``rows`` prompts per domain; ids ``<domain>-NNNN``, sorted; no prompt twice."""
    from build import CHAT_SCHEMA

    rng = random.Random("stdlib-v1")
    docs, code = passages(rng, 3 * rows), functions(rng, 3 * rows)
    made: dict[str, list[list[dict[str, str]]]] = {
        "ref_summary": [_turns(f"Summarize this passage from the Python reference in three "
                               f"sentences.\n\n{p}") for _, p in docs[:rows]],
        "ref_question": [_turns(f"{p}\n\nUsing only the passage above, explain in two "
                                f"sentences what {t.lower()} is for.")
                         for t, p in docs[rows : 2 * rows]],
        "ref_chat": [[{"role": "user", "content": f"I am learning Python and read this:\n\n{p}"},
                      {"role": "assistant", "content": "It is a lot at once. What would you "
                       "like to go through?"},
                      {"role": "user", "content": "Show me one short example and tell me what "
                       "it prints."}] for _, p in docs[2 * rows :]],
        "code_explain": [_turns(f"Explain what this function does, step by step.\n\n{s}")
                         for s, _ in code[:rows]],
        "code_docstring": [_turns("Write a docstring for this function. Answer with the "
                                  f"docstring only.\n\n{bare}")
                           for _, bare in code[rows : 2 * rows]],
        "code_tests": [_turns(f"Write two pytest tests for this function.\n\n{s}")
                       for s, _ in code[2 * rows :]],
    }  # fmt: skip
    out = [{"id": f"{domain}-{i:04d}", "domain": domain, "prompt": chat[-1]["content"],
            "messages": chat, "source": "python-stdlib-v1"}
           for domain, chats in made.items() for i, chat in enumerate(chats)]  # fmt: skip
    seen: dict[str, str] = {}
    for r in out:
        key = str(r["messages"])
        if seen.setdefault(key, r["id"]) != r["id"]:
            raise ValueError(f"stdlib: {r['id']} repeats {seen[key]}'s prompt")
    return pa.Table.from_pylist(sorted(out, key=lambda r: r["id"]), schema=CHAT_SCHEMA)
