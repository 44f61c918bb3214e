"""What a GPU machine without network needs for benchmarks/gpu_check.py, cut into transfers of at most
64 MiB (docs/gpu.md has the plan and the time each step took).

    python benchmarks/gpu_stage.py                    # SmolLM2: .gpu/a and .gpu/b (ignored by git)
    python benchmarks/gpu_stage.py --onnxruntime-gpu  # and ONNX Runtime's CUDA builds: .gpu/a .. .gpu/f
    python benchmarks/gpu_stage.py --llama-cpp-source # and llama-cpp-python's source: .gpu/a .. .gpu/c
    python benchmarks/gpu_stage.py --llama-cpp-wheel W  # or its CUDA build made here (gpu_build_llama.sh)

Each transfer carries one part folder (the `carry` of a device call); a part already sent stays on the
machine between calls (while it is held), in the same ignored folder. The parts hold:
    .gpu/a/   the manifest, the prompts as token ids (HumanEval and MT-Bench with their EOS ids: the
              machine has neither the prompt packages nor the model package), the `gguf` wheel
              (transformers reads a GGUF with it) and the first chunk of SmolLM2's Q4_1 GGUF;
    .gpu/b/.. the rest of the GGUF, then, when asked, the onnxruntime-gpu and onnxruntime-genai-cuda
              wheels (CUDA 13, Python 3.12), each part at most PART_BYTES.
`assemble` (called on the machine) joins a staged file once every one of its chunks has arrived and
the whole file's SHA-256 matches the manifest's.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGE = ROOT / ".gpu"
PART_BYTES = 60 << 20     # the transfer limit is 64 MiB, the repository's own files (~3 MiB) included
MANIFEST = "manifest.json"
PROMPTS = "prompts.json"
GGUF_NAME = "smollm2.gguf"
DATASETS = ("humaneval", "mtbench")
# the machine's Python and CUDA (docs/gpu.md): onnxruntime-gpu 1.31 is built for CUDA 13, and
# onnxruntime-genai-cuda 0.18 (the chain-mode build and its n-gram peer) runs on it
ORT_GPU = ("onnxruntime-gpu==1.31.1", "onnxruntime-genai-cuda==0.18.0")
# llama-cpp-python has no CUDA wheel on PyPI: its source, built there with nvcc (gpu_run.sh build-llama)
LLAMA_CPP_SOURCE = "llama-cpp-python==0.3.36"
LLAMA_CPP_DEPENDENCY = "diskcache"   # what llama_cpp imports that the GPU machine does not have
WHEEL_PLATFORM = ["--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
                  "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64"]


def stage(folder: Path = STAGE, n: int = 11, onnxruntime_gpu: bool = False, llama_cpp_source: bool = False,
          llama_cpp_wheel: Path | None = None) -> list[Path]:
    """Write the part folders under `folder` (n prompts per dataset, the warm-up one included);
    return them in the order they are to be sent. `llama_cpp_wheel`: a CUDA build of
    llama-cpp-python made here (gpu_build_llama.sh), staged with the one dependency the machine lacks."""
    from draftcore.adapters.torch_hf.smollm2 import load_smollm2_tokenizer, packaged_gguf
    from draftcore.tools.backends.prompts import load_prompts

    if llama_cpp_wheel is not None:
        llama_cpp_wheel = checked_llama_cpp_wheel(llama_cpp_wheel)
    shutil.rmtree(folder, ignore_errors=True)
    first = folder / "a"
    first.mkdir(parents=True)
    tokenizer = load_smollm2_tokenizer()
    prompts = [{"dataset": p.dataset, "idx": p.idx, "ids": p.ids.tolist()}
               for dataset in DATASETS for p in load_prompts(tokenizer, dataset, n)]
    (first / PROMPTS).write_text(json.dumps({"eos": [int(tokenizer.eos_token_id)], "prompts": prompts}))
    _download(first, ["gguf==" + _version("gguf")])
    files = [packaged_gguf()]
    if onnxruntime_gpu:
        wheels = folder / "wheels"
        _download(wheels, [*ORT_GPU, *WHEEL_PLATFORM])
        files += sorted(wheels.glob("*.whl"))
    if llama_cpp_source:
        sources = folder / "sources"
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary=:all:",
                        "-d", str(sources), LLAMA_CPP_SOURCE], check=True)
        files += sorted(sources.glob("*.tar.gz"))
    if llama_cpp_wheel is not None:
        wheels = folder / "wheels"
        _download(wheels, [f"{LLAMA_CPP_DEPENDENCY}==" + _version(LLAMA_CPP_DEPENDENCY)])
        files += [*sorted(wheels.glob("diskcache-*.whl")), llama_cpp_wheel]
    parts, manifest = [first], {"files": []}
    room = PART_BYTES - sum(f.stat().st_size for f in first.iterdir())
    for path in files:
        data = path.read_bytes()
        name = GGUF_NAME if path.suffix == ".gguf" else path.name
        entry = {"name": name, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "chunks": []}
        offset = 0
        while offset < len(data):
            if room <= 0:
                parts.append(folder / chr(ord("a") + len(parts)))
                parts[-1].mkdir()
                room = PART_BYTES
            chunk = data[offset:offset + room]
            chunk_name = f"{name}.{len(entry['chunks'])}"
            (parts[-1] / chunk_name).write_bytes(chunk)
            entry["chunks"].append([parts[-1].name, chunk_name])
            offset += len(chunk)
            room -= len(chunk)
        manifest["files"].append(entry)
    shutil.rmtree(folder / "wheels", ignore_errors=True)
    shutil.rmtree(folder / "sources", ignore_errors=True)
    (first / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return parts


def assemble(folder: Path = STAGE, name: str = GGUF_NAME) -> tuple[Path | None, str]:
    """(the joined file `name`, "") once every chunk is there and the whole file's SHA-256 matches,
    else (None, why not). Joined once: a later call finds the file and checks nothing again."""
    manifest_path = folder / "a" / MANIFEST
    if not manifest_path.is_file():
        return None, f"nothing staged: {manifest_path} is missing (run benchmarks/gpu_stage.py here, carry .gpu/a)"
    spec = next((f for f in json.loads(manifest_path.read_text())["files"] if f["name"] == name), None)
    if spec is None:
        return None, f"{name} was not staged (benchmarks/gpu_stage.py's options)"
    target = folder / spec["name"]
    if target.is_file() and target.stat().st_size == spec["bytes"]:
        return target, ""
    missing = sorted({part for part, chunk in spec["chunks"] if not (folder / part / chunk).is_file()})
    if missing:
        return None, f"{name} incomplete: parts {missing} not sent yet (carry .gpu/{missing[0]})"
    data = b"".join((folder / part / chunk).read_bytes() for part, chunk in spec["chunks"])
    if hashlib.sha256(data).hexdigest() != spec["sha256"]:
        return None, f"{name} corrupt: the joined parts' SHA-256 differs from the manifest's"
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, target)
    return target, ""


def staged_prompts(folder: Path = STAGE) -> dict | None:
    """{"eos": [...], "prompts": [{"dataset", "idx", "ids"}, ...]} as staged, or None."""
    path = folder / "a" / PROMPTS
    return json.loads(path.read_text()) if path.is_file() else None


def checked_llama_cpp_wheel(path) -> Path:
    """`path` as a Path, if it is a llama-cpp-python wheel; ConfigError naming it otherwise."""
    from draftcore.errors import ConfigError
    wheel = Path(path)
    if not wheel.is_file() or not wheel.name.startswith("llama_cpp_python-") or wheel.suffix != ".whl":
        raise ConfigError(f"--llama-cpp-wheel: expected a llama_cpp_python-*.whl file (benchmarks/gpu_build_llama.sh "
                          f"makes one), got {str(path)!r}")
    return wheel


def _version(package: str) -> str:
    from importlib import metadata
    return metadata.version(package)


def _download(folder: Path, arguments: list[str]) -> None:
    """pip's own download of wheels, without their dependencies (the machine has them)."""
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "-d", str(folder), *arguments], check=True)


def _print_assembled(suffix: str) -> None:
    """Join every staged file named *suffix whose parts have all arrived: its path on stdout (what
    gpu_run.sh installs), or why not on stderr."""
    manifest = STAGE / "a" / MANIFEST
    names = [f["name"] for f in json.loads(manifest.read_text())["files"]] if manifest.is_file() else []
    for name in (n for n in names if n.endswith(suffix)):
        path, why = assemble(STAGE, name)
        print(path if path else f"# {why}", file=sys.stdout if path else sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=11, help="prompts per dataset, the warm-up one included")
    ap.add_argument("--onnxruntime-gpu", action="store_true", help=f"stage {' and '.join(ORT_GPU)} too (for the ONNX section)")
    ap.add_argument("--llama-cpp-source", action="store_true",
                    help=f"stage {LLAMA_CPP_SOURCE}'s source too (built with CUDA there: gpu_run.sh build-llama)")
    ap.add_argument("--llama-cpp-wheel", type=Path, default=None,
                    help="stage this CUDA build of llama-cpp-python (made here by gpu_build_llama.sh) instead of its source")
    ap.add_argument("--assembled-source", action="store_true",
                    help="on the machine: join the staged llama-cpp-python source once all its parts arrived; print its path")
    ap.add_argument("--assembled-wheels", action="store_true",
                    help="on the machine: join the staged wheels whose parts have all arrived; print their paths")
    args = ap.parse_args()
    if args.assembled_wheels or args.assembled_source:
        _print_assembled(".whl" if args.assembled_wheels else ".tar.gz")
        return
    for part in stage(STAGE, args.n, args.onnxruntime_gpu, args.llama_cpp_source, args.llama_cpp_wheel):
        size = sum(f.stat().st_size for f in part.iterdir())
        print(f"{part.relative_to(ROOT)}: {size / 2**20:.1f} MiB ({', '.join(sorted(f.name for f in part.iterdir()))})")
    print("carry one part per device call, .gpu/a first (docs/gpu.md)")


if __name__ == "__main__":
    main()
