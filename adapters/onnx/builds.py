"""ONNX models made from a local HF folder, each by the tool users make it with, and cached.

    tree_export(hf_folder)    draftcore's export (export.py): tree mode
    genai_build(hf_folder)    onnxruntime-genai's model builder: a genai folder (genai_config.json,
                              model.onnx with GroupQueryAttention and a 2-D mask): chain mode, and
                              what onnxruntime-genai's own generation runs
    gqa_tree_build(hf_folder) the genai build rewired for tree mode (rewire.py): tree mode on the
                              builder's fused kernels

Both land in $DRAFTCORE_CACHE/onnx (default ~/.cache/draftcore/onnx), in a folder named after the HF
folder, the precision and a fingerprint of its config and weights, so a changed model is rebuilt. A
folder appears atomically (built in a temp folder, then renamed): a crash never leaves a half-built
model that a later run would trust.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from draftcore.errors import BackendError, ConfigError

_PRECISIONS = {"float32": "fp32", "float16": "fp16"}


def tree_export(hf_folder, dtype: str = "float32", cache_dir=None) -> Path:
    """The cached draftcore export of `hf_folder` (a folder holding model.onnx)."""
    from .export import export

    def build(tmp: Path):
        export(hf_folder, tmp, dtype=dtype)

    return _cached(hf_folder, f"tree-{_precision(dtype)}", build, cache_dir)


def genai_build(hf_folder, dtype: str = "float32", execution_provider: str = "cpu", cache_dir=None) -> Path:
    """The cached onnxruntime-genai build of `hf_folder` (`python -m onnxruntime_genai.models.builder
    -i hf_folder -o out -p fp32 -e cpu`); needs the onnxruntime-genai package."""
    try:
        import onnxruntime_genai  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"genai_build: onnxruntime-genai is not installed (pip install 'draftcore[onnx-genai]'): "
                          f"{exc}") from exc
    if execution_provider not in ("cpu", "cuda"):
        raise ConfigError(f"execution_provider: expected 'cpu' or 'cuda', got {execution_provider!r}")

    def build(tmp: Path):
        command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf_folder), "-o", str(tmp),
                   "-p", _precision(dtype), "-e", execution_provider, "-c", str(tmp / ".builder-cache")]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise BackendError(f"genai_build: onnxruntime-genai's model builder failed on {str(hf_folder)!r} "
                               f"(exit {done.returncode}): {done.stderr[-2000:]}")
        shutil.rmtree(tmp / ".builder-cache", ignore_errors=True)

    return _cached(hf_folder, f"genai-{_precision(dtype)}-{execution_provider}", build, cache_dir)


def gqa_tree_build(hf_folder, dtype: str = "float32", execution_provider: str = "cpu", cache_dir=None) -> Path:
    """The cached tree-mode rewiring (rewire.tree_from_genai) of `genai_build(hf_folder, ...)`."""
    from .rewire import tree_from_genai

    genai = genai_build(hf_folder, dtype, execution_provider, cache_dir)

    def build(tmp: Path):
        tree_from_genai(genai, tmp)

    return _cached(hf_folder, f"gqa-tree-{_precision(dtype)}-{execution_provider}", build, cache_dir)


def _precision(dtype: str) -> str:
    if dtype not in _PRECISIONS:
        raise ConfigError(f"dtype: expected one of {list(_PRECISIONS)}, got {dtype!r}")
    return _PRECISIONS[dtype]


def _cached(hf_folder, kind: str, build, cache_dir) -> Path:
    source = Path(hf_folder)
    if not (source / "config.json").is_file():
        raise ConfigError(f"hf_folder: {str(source)!r} is not a local HF model folder (no config.json)")
    root = Path(cache_dir or os.environ.get("DRAFTCORE_CACHE") or Path.home() / ".cache" / "draftcore") / "onnx"
    folder = root / f"{source.resolve().name}-{kind}-{_fingerprint(source)}"
    if (folder / ".complete").is_file():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=root))
    try:
        build(tmp)
        (tmp / ".complete").write_text("")
        try:
            os.replace(tmp, folder)
        except OSError:
            if not (folder / ".complete").is_file():   # not a concurrent build that won the race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _fingerprint(source: Path) -> str:
    """Config text and the weights' names, sizes and modification times (hashing gigabytes of
    weights on every run would cost more than the run)."""
    digest = hashlib.sha256((source / "config.json").read_bytes())
    for path in sorted(source.glob("*.safetensors")) + sorted(source.glob("*.bin")):
        stat = path.stat()
        digest.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:12]
