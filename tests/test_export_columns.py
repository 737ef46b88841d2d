"""``export --columns``: the default schema is the one docs/output.md promises, the profiles
keep what they say (and leave out nested columns no row filled), names keep the dataset's
order, the card says what was kept, and a bad value is one line naming the option."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from click.testing import CliRunner
from conftest import ROOT
from test_cli_errors import assert_user_error, cli
from test_observe_units import exported, synthetic_run

from batchspec.cli import main
from batchspec.io.writer import RESULT_FIELDS, output_schema
from batchspec.observe.export import export_dataset
from batchspec.observe.export_lines import export_lines

IDENTITY = ["id", "domain", "sample_index", "prompt"]
GENERATION = [*IDENTITY, "generated_text", "num_prompt_tokens", "num_output_tokens"]
GENERATION += ["finish_reason", "error"]
SPECULATIVE = ["engine", "spec_method", "num_speculative_tokens", "num_spec_steps"]
SPECULATIVE += ["num_draft_tokens", "num_accepted_tokens", "acceptance_rate"]
SPECULATIVE += ["mean_acceptance_length"]


def promised_columns() -> list[str]:
    """docs/output.md's column table, top to bottom (the pass-through columns left out)."""
    text = (ROOT / "docs" / "output.md").read_text().split("## Columns")[1].split("\n\n")[2]
    return [m.group(1) for m in re.finditer(r"^\| `(\w+)` \|", text, re.M)]


def columns_line(card: str) -> str:
    return next(line for line in card.splitlines() if line.startswith("- **columns**"))


def test_the_default_is_every_column_docs_output_md_promises(tmp_path: Path) -> None:
    out = synthetic_run(tmp_path)
    export_dataset(out, tmp_path / "default")
    export_dataset(out, tmp_path / "all", columns="all")
    got = exported(tmp_path / "default").schema
    promised = promised_columns()
    assert promised == ["id", "domain", *(f.name for f in RESULT_FIELDS)]
    want = output_schema(pa.string(), {})
    want = want.insert(want.get_field_index("generated_text"), pa.field("prompt", pa.string()))
    assert got.names == [*promised[:2], "sample_index", "prompt", *promised[3:]]
    assert [f.type for f in got] == [f.type for f in want]
    assert exported(tmp_path / "all").schema == got
    card = (tmp_path / "default" / "README.md").read_text()
    assert "all 28 of the run's columns (`--columns all`)" in columns_line(card)
    # Kept as promised, and said to be empty: nothing in this run asked for logprobs.
    assert "| `logprobs` |" in card and "null in every row of this dataset |" in card
    assert "## Why some rows have no acceptance" in card


def test_profiles_keep_what_they_name_and_leave_out_empty_nested_columns(tmp_path: Path) -> None:
    out = synthetic_run(tmp_path)
    r = export_dataset(out, tmp_path / "gen", columns="generation")
    assert exported(tmp_path / "gen").column_names == GENERATION and r.prompt_column == "prompt"
    card = (tmp_path / "gen" / "README.md").read_text()
    line = columns_line(card)
    assert "9 of the run's 28 (`--columns generation`); left out: `engine`" in line
    assert "`unit_id`; and, null in every row of the run, `logprobs`, `prompt_logprobs`" in line
    assert "## Why some rows have no acceptance" not in card and "| `engine` |" not in card
    export_dataset(out, tmp_path / "acc", columns="acceptance")
    names = exported(tmp_path / "acc").column_names
    assert names == GENERATION[:-1] + SPECULATIVE + ["error"]
    line = columns_line((tmp_path / "acc" / "README.md").read_text())
    assert "left out: `queue_s`, `ttft_s`, `decode_s`, `e2e_s`, `output_tokens_per_s`" in line
    assert "`unit_id`; and, null in every row of the run, `acceptance_histogram`" in line


def test_a_nested_column_one_row_filled_is_kept(tmp_path: Path) -> None:
    out = synthetic_run(tmp_path)
    part = out.part_files()[-1]
    table = pq.read_table(part)
    at = table.schema.get_field_index("logprobs")
    cells = [None] * table.num_rows
    cells[0] = [[{"token_id": 7, "logprob": -0.5}]]
    table = table.set_column(at, table.schema.field(at), pa.array(cells, table.schema[at].type))
    pq.write_table(table, part)
    export_dataset(out, tmp_path / "ds", columns="generation")
    got = exported(tmp_path / "ds")
    assert "logprobs" in got.column_names and "prompt_logprobs" not in got.column_names
    assert got.column("logprobs").null_count == got.num_rows - 1


def test_names_keep_the_datasets_order_and_are_kept_empty_or_not(tmp_path: Path) -> None:
    out = synthetic_run(tmp_path)
    export_dataset(out, tmp_path / "ds", columns=" generated_text,id , unit_id")
    assert exported(tmp_path / "ds").column_names == ["id", "generated_text", "unit_id"]
    card = (tmp_path / "ds" / "README.md").read_text()
    assert "left out (`--columns`): they are the input's `prompt` column" in card
    export_dataset(out, tmp_path / "ds2", columns="generation,prompt_logprobs,e2e_s")
    got = exported(tmp_path / "ds2").column_names
    assert got == [*GENERATION[:-1], "prompt_logprobs", "e2e_s", "error"]
    dest = tmp_path / "rows.jsonl"
    export_lines(out, dest, "jsonl", columns="generation")
    first = json.loads(dest.read_text().splitlines()[0])
    assert list(first) == GENERATION and first["id"] == "r00000"


def test_a_bad_columns_value_is_one_line_naming_the_option(tmp_path: Path) -> None:
    out = synthetic_run(tmp_path)
    dest = tmp_path / "ds"
    base = ["export", str(out), "--to", str(dest), "--columns"]
    assert_user_error(cli(*base, "generation,nope"), "--columns: 'nope'", "profile", "unit_id")
    assert_user_error(cli(*base, "id,,generated_text"), "--columns:", "empty name")
    refused = cli(*base, "prompt,generated_text", "--no-prompts")
    assert_user_error(refused, "--columns: 'prompt' is the prompt column", "--no-prompts")
    refused = cli(*base, "generation", "--format", "openai-batch")
    assert_user_error(refused, "--columns:", "openai-batch")
    assert not dest.exists() and not list(tmp_path.glob(".ds*"))
    result = CliRunner().invoke(main, [*base, "acceptance"])
    assert result.exit_code == 0 and "exported 30 rows" in result.stdout
