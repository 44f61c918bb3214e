#!/usr/bin/env bash
# Build the one part of arctic-inference that vLLM's `suffix` speculative method imports
# (arctic_inference.suffix_decoding and its C++ suffix tree) into the vLLM venv, for
# benchmarks/vllm_proposer.py's `suffix` column.
#
#   benchmarks/build_arctic_suffix.sh [VENV]        (default .venv-vllm; about a minute on 2 cores)
#
# Why not `pip install arctic-inference`: PyPI has only its sdist, whose build requirements pull a
# CUDA torch (gigabytes) and whose package registers a vLLM plugin that patches vLLM where the
# versions match. vLLM's suffix proposer needs neither: it imports
# `arctic_inference.suffix_decoding.SuffixDecodingCache`, pure Python over a nanobind extension
# (`_C`: SuffixTree, Draft). So this script compiles that extension with the project's own CMake
# file and copies just that subpackage into the venv: no plugin, no other part of arctic-inference.
set -euo pipefail
cd "$(dirname "$0")/.."
test -x "${1:-.venv-vllm}/bin/python" || { echo "no venv at ${1:-.venv-vllm}: run 'make test-vllm' first (it builds .venv-vllm)" >&2; exit 1; }
VENV="$(cd "${1:-.venv-vllm}" && pwd)"   # absolute: CMake runs its checks in other folders
VERSION="0.3.0"                      # the version whose suffix tree the benchmarks were measured with
PY="$VENV/bin/python"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
"$PY" -m pip install -q "nanobind==2.9.2" cmake ninja          # arctic-inference's own build pins
# no build isolation: its build requirements would pull a torch; fetching needs none of them
"$PY" -m pip download -q --no-deps --no-build-isolation -d "$WORK" "arctic-inference==$VERSION"
tar -xzf "$WORK"/arctic_inference-"$VERSION".tar.gz -C "$WORK"
SRC="$WORK/arctic_inference-$VERSION"

# The CMake project of csrc/suffix_decoding finds nanobind through the interpreter it is given.
CMAKE="$VENV/bin/cmake"
"$CMAKE" -S "$SRC/csrc/suffix_decoding" -B "$WORK/build" -G Ninja -DCMAKE_MAKE_PROGRAM="$VENV/bin/ninja" \
    -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$PY" >/dev/null
"$CMAKE" --build "$WORK/build" -j "$(nproc)" >/dev/null

SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
DEST="$SITE/arctic_inference"
mkdir -p "$DEST/suffix_decoding"
# arctic_inference/__init__.py holds only the licence header: the subpackage imports nothing else.
cp "$SRC/arctic_inference/__init__.py" "$DEST/__init__.py"
cp "$SRC/arctic_inference/suffix_decoding/"*.py "$DEST/suffix_decoding/"
cp "$WORK"/build/_C*.so "$DEST/suffix_decoding/"
cp "$SRC/LICENSE" "$DEST/LICENSE"

"$PY" - <<'EOF'
from arctic_inference.suffix_decoding import SuffixDecodingCache
cache = SuffixDecodingCache(max_tree_depth=8, max_cached_requests=4)
print("arctic_inference.suffix_decoding: built and importable,", type(cache).__name__)
EOF
