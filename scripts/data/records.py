"""The records set, ``records.parquet``: prompts shaped like users' synthetic-data jobs, where a
domain is one task template filled in many times (extraction into JSON, labelling, rewriting,
questions over a small table, docstrings), so that rows of a domain share structure and their
answers share text: the case suffix drafts from the job's own outputs are built for (issue 35).
Six domains of 40 rows from fixed lists and a fixed seed, in the default set's columns.
"""

from __future__ import annotations

import random

import pyarrow as pa

ITEMS = ["desk lamp", "water bottle", "backpack", "notebook", "coffee mug", "phone case",
         "wool scarf", "garden hose", "yoga mat", "bike helmet"]  # fmt: skip
PRAISE = ["works perfectly", "arrived early", "is well made", "is worth the price"]
FAULTS = ["broke after a week", "arrived late", "feels cheap", "stopped working"]
CASUAL = [
    "hey {name}, cant make it {day}, my {item} {fault}. can we move it to next week? thx",
    "{name}!! got your {item} today, it {praise}. lets meet {day} to talk about the rest",
    "yo {name}, the {item} thing is still not sorted, it {fault}. call me {day} pls",
]
FUNCS = [("add_tax", "price, rate", "price * (1 + rate)"),
         ("mean", "values", "sum(values) / len(values)"),
         ("clamp", "x, low, high", "max(low, min(x, high))"),
         ("is_even", "n", "n % 2 == 0"),
         ("initials", "name", "''.join(w[0] for w in name.split())"),
         ("area", "width, height", "width * height"),
         ("celsius", "fahrenheit", "(fahrenheit - 32) * 5 / 9"),
         ("last", "items", "items[-1] if items else None")]  # fmt: skip
DAYS = ["on Monday", "on Friday", "tomorrow", "this weekend"]


def _person(rng: random.Random, i: int) -> str:
    from build import ASK, CITIES, JOBS, NAMES, NOTES

    name, city = NAMES[i % len(NAMES)], CITIES[(i * 7 + 3) % len(CITIES)]
    they = "she" if name.split()[0] in {"Maria", "Aiko", "Lena", "Clara", "Julia"} else "he"
    age, job = rng.randint(19, 78), rng.choice(JOBS)
    note = NOTES[i % len(NOTES)].format(name=name, age=age, city=city, job=job, they=they,
                                        They=they.capitalize())  # fmt: skip
    return ASK + note


def _order(rng: random.Random, i: int) -> str:
    from build import CITIES, NAMES

    item, city = ITEMS[i % len(ITEMS)], CITIES[(i * 3) % len(CITIES)]
    return ('Extract the order from the email as a JSON object with the keys "item", '
            '"quantity", "unit_price" and "city".\n\nEmail: Hello, I would like to order '
            f"{rng.randint(2, 12)} of your {item}s at {rng.randint(5, 90)} dollars each, "
            f"delivered to {city}. Best regards, {NAMES[i % len(NAMES)]}")  # fmt: skip


def _review(rng: random.Random, i: int) -> str:
    good, item = i % 2 == 0, ITEMS[(i // 2) % len(ITEMS)]
    said = (PRAISE if good else FAULTS)[(i // 20) % 4]
    when = rng.choice(["last month", "two weeks ago", "in spring", "for my son"])
    return ('Label the review as "positive" or "negative" and answer as a JSON object with the '
            f'keys "label" and "reason".\n\nReview: I bought the {item} {when} and it '
            f"{said}. {'I would buy it again.' if good else 'I want a refund.'}")  # fmt: skip


def _rewrite(rng: random.Random, i: int) -> str:
    from build import NAMES

    msg = CASUAL[i % len(CASUAL)].format(
        name=NAMES[i % len(NAMES)].split()[0], day=rng.choice(DAYS), item=ITEMS[(i * 3) % 10],
        fault=rng.choice(FAULTS), praise=rng.choice(PRAISE))  # fmt: skip
    return f"Rewrite this message in polite, formal English, keeping every fact:\n\n{msg}"


def _table(rng: random.Random, i: int) -> str:
    from build import CITIES

    cities = rng.sample(CITIES, 4)
    lines = [f"| {c} | {rng.randint(1, 40) * 50} | {rng.randint(-5, 30)} |" for c in cities]
    ask = ["Which city has the most people?", "Which city is the warmest?",
           "Which city has the fewest people?", "Which city is the coldest?"][i % 4]  # fmt: skip
    return ("| city | population (thousands) | mean temperature (C) |\n|---|---|---|\n"
            + "\n".join(lines) + f"\n\n{ask} Answer in one sentence that names the city "
            "and gives the number from the table.")  # fmt: skip


STYLES = ["def {f}({a}):\n    return {b}", "def {f}({a}):\n    result = {b}\n    return result",
          "def {f}({t}):\n    return {b}", "def {f}({a}):\n    # one expression\n    return {b}",
          "def {f}({t}) -> object:\n    out = {b}\n    return out"]  # fmt: skip
"""Ways of writing each function, so that no two docstring prompts are the same."""


def _docstring(rng: random.Random, i: int) -> str:
    f, a, b = FUNCS[i % len(FUNCS)]
    typed = ", ".join(f"{x}: object" for x in a.split(", "))
    code = STYLES[(i // len(FUNCS)) % len(STYLES)].format(f=f, a=a, t=typed, b=b)
    return ("Write a one-line Python docstring for this function. Answer with the docstring "
            f"only, in triple quotes.\n\n{code}")  # fmt: skip


DOMAINS = {"extract_person": _person, "extract_order": _order, "review_label": _review,
           "rewrite_formal": _rewrite, "table_qa": _table, "docstring": _docstring}  # fmt: skip


def build(rows: int = 40) -> pa.Table:
    """``rows`` prompts per domain, deterministic; ids ``<domain>-NNNN``, sorted."""
    from build import CHAT_SCHEMA

    out = []
    for domain, make in DOMAINS.items():
        rng = random.Random(f"records-v1-{domain}")
        for i in range(rows):
            prompt = make(rng, i)
            out.append({"id": f"{domain}-{i:04d}", "domain": domain, "prompt": prompt,
                        "messages": [{"role": "user", "content": prompt}],
                        "source": "records-v1"})  # fmt: skip
    seen: dict[str, str] = {}
    for r in out:
        if seen.setdefault(r["prompt"], r["id"]) != r["id"]:
            raise ValueError(f"records: {r['id']} repeats {seen[r['prompt']]}'s prompt")
    return pa.Table.from_pylist(sorted(out, key=lambda r: r["id"]), schema=CHAT_SCHEMA)
