"""The files an input is read from, and what each holds: Parquet (read as it is), JSON lines,
OpenAI batch requests or Arrow IPC (staged once into Parquet, ``io/convert.py``).

A Hugging Face dataset comes in two shapes. ``datasets``' ``save_to_disk`` writes a folder
with ``state.json`` (its Arrow files, in order, and its split) or, for several splits,
``dataset_dict.json`` and a folder per split; read here with pyarrow alone (the files are Arrow
IPC streams), so ``datasets`` is not needed to read them. A Hub-style folder holds Parquet or
JSONL shards whose paths name their split (``data/train-00000-of-00004.parquet``,
``test/0.jsonl``), the convention ``datasets.load_dataset`` follows; a folder whose files name
no split is one split. A dataset card's ``configs:`` block is not read.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchspec.errors import UserError
from batchspec.spec import JobSpec
from batchspec.spec.input import JSONL_SUFFIXES

SPLIT_NAMES = ("train", "test", "validation", "valid", "dev", "eval")
"""Split names recognised in a Hub-style folder's paths (the ones ``datasets`` looks for)."""
DEFAULT_SPLIT = "train"
SHARD_SUFFIXES = (".parquet", ".arrow", *JSONL_SUFFIXES)


@dataclass(frozen=True)
class Source:
    """One input file and how it is read: ``parquet`` as it is; ``jsonl``, ``openai-batch``
    and ``arrow`` through a staged Parquet copy."""

    path: Path
    kind: str

    @property
    def staged(self) -> bool:
        return self.kind != "parquet"


def input_sources(spec: JobSpec) -> list[Source]:
    """Every file of the job's input, in planning order, with its kind."""
    fmt = spec.input.format
    files = spec.input_files()
    if fmt == "hf":
        return hf_sources(files[0], spec.input.split)
    if fmt in ("jsonl", "openai-batch"):
        return [Source(f, fmt) for f in files]
    return [Source(f, "parquet") for f in files]


def _kind(path: Path) -> str:
    if path.name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    return "arrow" if path.suffix == ".arrow" else "parquet"


def hf_sources(root: Path, split: str | None) -> list[Source]:
    """The files of one split of a dataset folder (or of one ``.arrow`` file)."""
    if root.is_file():
        if split is not None:
            raise UserError(f"input.split: {root} is one file, not a dataset with splits")
        return [Source(root, _kind(root))]
    if (root / "dataset_dict.json").is_file():
        splits = _read_json(root / "dataset_dict.json").get("splits")
        if not isinstance(splits, list) or not all(isinstance(s, str) for s in splits):
            raise UserError(f"{root / 'dataset_dict.json'}: no list of splits in it")
        chosen = _choose(split, splits, root)
        return _saved(root / chosen, chosen)
    if (root / "state.json").is_file():
        return _saved(root, split)
    return _hub_folder(root, split)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: not readable as JSON ({exc})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: not a JSON object")
    return data


def _choose(split: str | None, splits: list[str], root: Path) -> str:
    """The split asked for, else ``train``, else the only one; a UserError listing them."""
    if split is not None and split in splits:
        return split
    if split is None and (DEFAULT_SPLIT in splits or len(splits) == 1):
        return DEFAULT_SPLIT if DEFAULT_SPLIT in splits else splits[0]
    have = ", ".join(splits) or "none"
    if split is None:
        raise UserError(f"input.split: {root} has the splits {have}; name one")
    raise UserError(f"input.split: {split!r} is not a split of {root} (it has {have})")


def _saved(folder: Path, split: str | None) -> list[Source]:
    """A ``save_to_disk`` folder of one split: its Arrow files as ``state.json`` lists them."""
    state = _read_json(folder / "state.json")
    files = state.get("_data_files")
    if not isinstance(files, list) or not files:
        raise UserError(f"{folder / 'state.json'}: no _data_files listed; not a saved dataset")
    own = state.get("_split")
    if split is not None and own is not None and own != split:
        raise UserError(f"input.split: {folder} holds the split {own!r}, not {split!r}")
    sources = []
    for entry in files:
        name = entry.get("filename") if isinstance(entry, dict) else None
        path = folder / name if isinstance(name, str) and "/" not in name else None
        if path is None or not path.is_file():
            raise UserError(f"{folder / 'state.json'}: lists {entry!r}, which is not a file here")
        sources.append(Source(path, "arrow"))
    return sources


def split_of(relative: Path) -> str | None:
    """The split a shard's path names (a folder ``test/``, or a name ``train-00000-of-...``),
    or None."""
    for part in relative.parts:
        for name in SPLIT_NAMES:
            if part == name or re.match(rf"{name}([-_.\d]|$)", part):
                return name
    return None


def _hub_folder(root: Path, split: str | None) -> list[Source]:
    """A Hub-style folder: the shards of the split asked for (``train`` by default), or every
    shard when no path names a split."""
    shards = sorted(
        p
        for p in root.rglob("*")
        if p.is_file()
        and p.name.endswith(SHARD_SUFFIXES)
        and not any(part.startswith(".") for part in p.relative_to(root).parts)
    )
    if not shards:
        raise UserError(f"input.path: {root} holds no Parquet, JSONL or Arrow shard")
    by_split: dict[str | None, list[Path]] = {}
    for p in shards:
        by_split.setdefault(split_of(p.relative_to(root)), []).append(p)
    named = sorted(s for s in by_split if s is not None)
    if not named:
        if split is not None:
            raise UserError(f"input.split: no path under {root} names a split; leave it unset")
        chosen: str | None = None
    else:
        chosen = _choose(split, named, root)
    return [Source(p, _kind(p)) for p in by_split[chosen]]
