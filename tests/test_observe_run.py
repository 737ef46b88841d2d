"""run → status → report → export on one real run of the embedded model (in-process engine):
12 prompts, domains interleaved row by row, so that every chunk's rows lie in several parts
and export has to put them back in input order."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import polars as pl
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner
from conftest import IN_PROCESS_ENGINE, PROMPTS, job_dict, run_cli, write_job
from support.doc_examples import shapes, status_examples

from batchspec.cli import main
from batchspec.observe.plots import DPI

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def done_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """(input file, output directory, the run's stderr): 2 rows per domain, interleaved."""
    tmp = tmp_path_factory.mktemp("observe")
    df = pl.read_parquet(PROMPTS).group_by("domain", maintain_order=True).head(2)
    rank = pl.int_range(pl.len()).over("domain").alias("rank")
    df.with_columns(rank).sort("rank", "domain").drop("rank").write_parquet(tmp / "in.parquet")
    job = job_dict(tmp / "out", input={"path": str(tmp / "in.parquet")})
    job["output"]["unit_rows"] = 4
    job["sampling"]["max_tokens"] = 16
    path = write_job(tmp / "job.yaml", job)
    result = run_cli("run", str(path), "--log-every", "1", env=IN_PROCESS_ENGINE)
    assert result.returncode == 0, result.stderr[-3000:]
    return tmp / "in.parquet", tmp / "out", result.stderr


def k_last(out: Path) -> dict[str, int]:
    """Each domain's K in its last committed unit: the K controller (K priced from vLLM's
    steps) chooses K per unit, so the run decides it; the last committed is the newest part
    (units at different K finish in any order)."""
    parts = sorted((out / "parts").rglob("*.parquet"), key=lambda p: p.stat().st_mtime_ns)
    k = {}
    for path in parts:  # in commit order: a later unit of a domain overwrites an earlier one
        k.update(pl.read_parquet(path).select("domain", "num_speculative_tokens").iter_rows())
    return k


def cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_progress_lines_count_rows_of_the_run(done_run: tuple[Path, Path, str]) -> None:
    """stderr is no terminal here: one summary line per --log-every, the last one complete;
    a line as the engine starts says so (``engines/starts.py``)."""
    _, out, stderr = done_run
    lines = [line for line in stderr.splitlines() if line.startswith("progress: ")]
    assert lines, stderr[-2000:]
    starting = [line for line in lines if "starting the engine" in line]
    assert starting, lines
    assert re.fullmatch(r"progress: starting the engine \(vLLM(, ~\d+ s last time)?\)", starting[0])
    lines = [line for line in lines if re.match(r"progress: \d+/", line)]
    done = [int(m.group(1)) for m in (re.match(r"progress: (\d+)/12 rows", x) for x in lines)]
    assert done == sorted(done) and done[-1] == 12
    assert "(100.0%)" in lines[-1] and "0 error rows" in lines[-1] and "ETA 0:00:00" in lines[-1]
    assert all(f" {d} " in lines[-1] for d in ["chat", "code", "math", "qa", "translation"])
    for d, k in k_last(out).items():
        assert re.search(rf"\b{d} \S+ K{k}\b", lines[-1]), (d, k, lines[-1])


def test_status_json_after_the_run(done_run: tuple[Path, Path, str]) -> None:
    _, out, _ = done_run
    code, stdout, _ = cli("status", str(out), "--json")
    assert code == 0
    st = json.loads(stdout)
    assert st["schema_version"] == 1 and st["state"] == "complete"
    assert st["units"]["done"] == st["units"]["total"] and st["units"]["pending"] == 0
    assert st["rows"] == {"total": 12, "committed": 12, "finished_uncommitted": 0, "error_rows": 0}
    parts = pl.read_parquet(out / "parts")
    assert st["output_tokens"] == parts["num_output_tokens"].sum()
    assert [w["state"] for w in st["workers"]] == ["ended"] and st["leases"] == []
    assert st["eta_s"] == 0.0 and st["throughput"][0]["output_tokens_per_s"] > 0
    by_domain = {d["domain"]: d for d in st["domains"]}
    assert set(by_domain) == set(parts["domain"]) and all(d["rows"] == 2 for d in st["domains"])
    sums = parts.group_by("domain").agg(pl.col("num_accepted_tokens", "num_draft_tokens").sum())
    for d in sums.iter_rows(named=True):
        drafted = d["num_draft_tokens"]
        want = d["num_accepted_tokens"] / drafted if drafted else None
        assert by_domain[d["domain"]]["acceptance_rate"] == pytest.approx(want), d
        assert by_domain[d["domain"]]["k_last"] == k_last(out)[d["domain"]]
        assert by_domain[d["domain"]]["k_in_use"] == []
    code, text, _ = cli("status", str(out))
    assert code == 0 and "complete" in text and "rows: 12/12 committed (100.0%)" in text


def test_the_docs_status_examples_after_a_run_are_what_status_prints(
    done_run: tuple[Path, Path, str],
) -> None:
    """The README's and operations.md's ``status`` examples of a finished run show the lines
    ``status`` prints after this run, shape for shape (numbers, names and paths aside): every
    kind of line, a domain's ending as this run's do (the K controller's chosen K and the
    tokens per step replayed)."""
    _, out, _ = done_run
    code, text, _ = cli("status", str(out))
    assert code == 0
    real = shapes(text.splitlines())
    finished = [b for b in status_examples() if b[0].endswith(": complete")]
    assert len(finished) >= 2  # the README's and operations.md's
    for block in finished:
        example = shapes(block)
        assert set(example) == set(real), block
        for kind in set(real) - {"domain"}:
            assert example[kind] == real[kind], (kind, example[kind], real[kind])
        # An example may show fewer domains; each of its lines is one this run prints.
        assert example["domain"] <= real["domain"], (example["domain"], real["domain"])


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_report_markdown_and_plots(done_run: tuple[Path, Path, str], tmp_path: Path) -> None:
    _, out, _ = done_run
    code, stdout, _ = cli("report", str(out), "--markdown", "--plots", str(tmp_path / "plots"))
    assert code == 0
    blocks = (block.splitlines() for block in stdout.strip().split("\n\n"))
    domains, k_view, predicted = blocks
    assert domains[0].startswith("| domain | rows | errors | out_tok | acc_rate | mean_acc_len")
    assert "p50_s | p95_s" in domains[0] and len(domains) == 2 + 6
    assert all(line.split(" | ")[1] == "2" for line in domains[2:])
    # The K controller's view: every domain replayed at every K of the grid, the K each ran
    # at measured (the first unit at the job's K=3).
    assert k_view[0].startswith("| domain | chosen_K | tok/s | K=0 |") and len(k_view) == 2 + 6
    header = k_view[0].split(" | ")
    for line in k_view[2:]:
        cells = line.split(" | ")
        domain = cells[0].strip("| ")
        assert any("*" in cell for cell in cells[3:]), (domain, line)
        # The view is the run's most common batch size: a last unit observed at another batch
        # (a domain's tail, in CI: K=8) is not in it; where it is, it is marked measured.
        column = f"K={k_last(out)[domain]}"
        assert column not in header or "*" in cells[header.index(column)], (domain, line)
    # And the predicted tokens/s at every K, why each K was chosen.
    assert predicted[0].startswith("| domain | chosen_K | K=0 |") and len(predicted) == 2 + 6
    names = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert names == [
        "acceptance_by_domain.png",
        "acceptance_histograms.png",
        "k_over_time.png",
        "latency.png",
        "throughput_over_time.png",
    ]
    for name in names:
        width, height = png_size(tmp_path / "plots" / name)
        # The histograms have a 4-inch panel per domain that drafted, up to 3 a row: with
        # domains' first units blind, as few as one drafts in this short run.
        panels = name == "acceptance_histograms.png"
        low = 4 * DPI if panels else 600
        assert low <= width <= 2000 and 300 <= height <= 1500, (name, width, height)
        size = (tmp_path / "plots" / name).stat().st_size  # drawn, not blank: one panel 13 KB
        assert size > (10_000 if panels else 15_000), (name, size)


def test_export_is_the_input_in_order(done_run: tuple[Path, Path, str], tmp_path: Path) -> None:
    inp, out, _ = done_run
    dest = tmp_path / "dataset"
    code, stdout, _ = cli("export", str(out), "--to", str(dest))
    assert code == 0 and "exported 12 rows in input order" in stdout
    files = sorted(p.name for p in (dest / "data").iterdir())
    assert files == ["train-00000-of-00001.parquet"]
    assert pq.ParquetFile(dest / "data" / files[0]).metadata.row_group(0).column(0).compression == (
        "ZSTD"
    )
    got = pads.dataset(dest / "data", format="parquet").to_table()
    source = pq.read_table(inp)
    assert got.column("id").to_pylist() == source.column("id").to_pylist()
    # The job reads a messages column: row i's chat is input row i's, beside the generation.
    assert "prompts in `messages`" in stdout
    assert got.column("messages").to_pylist() == source.column("messages").to_pylist()
    assert got.column_names.index("messages") + 1 == got.column_names.index("generated_text")
    parts = pl.read_parquet(out / "parts")
    texts = dict(zip(parts["id"], parts["generated_text"], strict=True))
    assert got.column("generated_text").to_pylist() == [
        texts[i] for i in got.column("id").to_pylist()
    ]
    card = (dest / "README.md").read_text()
    meta = yaml.safe_load(card.split("---\n")[1])
    assert meta["configs"] == [
        {"config_name": "default", "data_files": [{"split": "train", "path": "data/train-*"}]}
    ]
    assert "| domain | rows |" in card and "`ngram`" in card and "unit_rows: 4" in card
    assert "| `messages` | `list<struct<role: string, content: string>>` | the chat" in card
    assert "| `source` | `string` | copied from the input's `source` column |" in card
    code, _, stderr = cli("export", str(out), "--to", str(dest))
    assert code == 2 and stderr.count("\n") == 1 and "not empty" in stderr
