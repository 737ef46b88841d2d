"""Job spec: the YAML a user writes, parsed into one validated section per concern.

Every key is checked here, before anything expensive starts, so that a typo costs a one-line
error rather than an engine start. Where a key maps to a vLLM parameter it carries vLLM's name
(``max_model_len``, ``num_speculative_tokens``, ``prompt_lookup_min``, ``max_num_seqs`` ...), so
a vLLM user can read a spec without a glossary. Each field's description is the one place it
is documented: the job-spec reference (``docs/spec.md``) is generated from them (``docs``).

One module per section (``input``, ``model``, ``speculative`` with ``tree``, ``sampling``,
``execution``; ``job`` puts them together with ``output``), the rules they share in ``keys`` and
``base``; reading a file in ``file``. The names users import come from here, as before the spec
became a package: ``from batchspec.spec import JobSpec``.
"""

from batchspec.spec.execution import ExecutionSpec
from batchspec.spec.input import InputSpec
from batchspec.spec.job import JobSpec, OutputSpec
from batchspec.spec.keys import OUTPUT_NEUTRAL
from batchspec.spec.model import MAX_NUM_SEQS, ModelSpec
from batchspec.spec.sampling import SamplingSpec
from batchspec.spec.speculative import SpecMethod, SpeculativeSpec
from batchspec.spec.tree import TreeSpec

__all__ = [
    "MAX_NUM_SEQS",
    "OUTPUT_NEUTRAL",
    "ExecutionSpec",
    "InputSpec",
    "JobSpec",
    "ModelSpec",
    "OutputSpec",
    "SamplingSpec",
    "SpecMethod",
    "SpeculativeSpec",
    "TreeSpec",
]
