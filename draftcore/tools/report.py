"""The one table writer, and the "report" object every benchmark's JSON carries.

Every table the CLI and the benchmark scripts print goes through `markdown_table`, and the same
cells go into the run's report (`make_report`): its title, the command as run, the date, the
machine and the tables as printed. `draftcore results` (results.py) renders docs/results.md from
those reports, so a figure never leaves the command, the date and the machine that produced it.

    header = ["dataset", "tokens/step"]
    rows = [["humaneval", "2.31"]]
    shown = show_table("tokens per step", header, rows)     # printed, and kept as printed
    report = make_report("My benchmark", [shown], settings={"budget": 8})
"""
from __future__ import annotations

import os
import platform
import shlex
import sys
import time
from importlib import metadata

from ..errors import InputError

# modules whose version a report records only when the run has already imported them: importing a
# framework just to name its version would cost seconds, and a run that never used it owes it nothing
FRAMEWORKS = ("torch", "transformers", "onnxruntime", "onnxruntime_genai", "llama_cpp", "vllm")
RUNTIME = ("numpy", "numba")   # always recorded: the runtime itself runs on them


def markdown_table(header, rows) -> str:
    """A markdown table: one header row, then one row per item of `rows`, every cell str()'d.
    InputError for a row whose cell count differs from the header's."""
    header = list(header)
    lines = [_markdown_row(header), "|" + "---|" * len(header)]
    for i, row in enumerate(rows):
        row = list(row)
        if len(row) != len(header):
            raise InputError(f"rows[{i}]: expected {len(header)} cells (the header's {header}), got {len(row)}: {row}")
        lines.append(_markdown_row(row))
    return "\n".join(lines)


def _markdown_row(cells) -> str:
    # a "|" inside a cell would split it in two, a newline would end the row
    return "| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |"


def table(title: str, header, rows) -> dict:
    """A table as a report keeps it: title ("" for none), header and rows, every cell as printed."""
    return {"title": str(title), "header": [str(h) for h in header], "rows": [[str(c) for c in row] for row in rows]}


def table_text(kept: dict) -> str:
    """A kept table (`table`) as printed: its title line, when it has one, above the markdown."""
    text = markdown_table(kept["header"], kept["rows"])
    return f"{kept['title']}\n\n{text}" if kept["title"] else text


def show_table(title: str, header, rows) -> dict:
    """Print a table (`table_text`) and return it as a report keeps it."""
    kept = table(title, header, rows)
    print(table_text(kept), flush=True)
    return kept


def make_report(title: str, tables, *, command: str | None = None, settings: dict | None = None) -> dict:
    """The report object a benchmark writes into its JSON.

    tables: the tables as printed (`table` / `show_table`).
    command: the command line as run; default: this process's (`command_line`).
    settings: what the run chose beyond its command line (a backend's kernels, threads, the model's
        attention); recorded with the machine.
    """
    return {"title": str(title), "command": command or command_line(), "date": time.strftime("%Y-%m-%d %H:%M %z"),
            "machine": machine(settings), "tables": list(tables)}


# What caps the instruction set of torch's own kernels, oneDNN's and MKL's: a run on an AVX-512 CPU
# with all three set to AVX2 runs AVX2's kernels (docs/results.md, "AVX2's kernels on an AVX-512 CPU").
KERNEL_ISA_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")


def command_line(argv=None, environ=None) -> str:
    """The command as one types it again from the current folder: `python benchmarks/x.py --n 2` for
    a script (the interpreter by its path when it lies in this folder, as .venv/bin/python does),
    `draftcore bench ...` for a console script, after the DRAFTCORE_* variables set in `environ`
    (draftcore's options read there: `DRAFTCORE_LLAMACPP_KV=q8_0 python ...`; the cache folder
    aside) and those that cap the kernels' instruction set (`KERNEL_ISA_VARIABLES`). argv: default
    sys.argv; environ: default os.environ."""
    argv = list(sys.argv if argv is None else argv)
    environ = os.environ if environ is None else environ
    options = [f"{name}={environ[name]}" for name in sorted(environ)
               if (name.startswith("DRAFTCORE_") and name != "DRAFTCORE_CACHE") or name in KERNEL_ISA_VARIABLES]
    program = _path_as_typed(argv[0])
    if program.endswith(".py"):
        interpreter = _path_as_typed(sys.executable)
        words = [interpreter if not os.path.isabs(interpreter) else "python", program]
    else:
        words = [os.path.basename(program)]
    return " ".join(shlex.quote(option) for option in options) + " " * bool(options) + \
        shlex.join(words + [str(a) for a in argv[1:]])


def _path_as_typed(path: str) -> str:
    """`path` relative to the current folder when it lies inside it, else unchanged."""
    relative = os.path.relpath(os.path.abspath(path))
    return path if relative.startswith("..") else relative


def machine(settings: dict | None = None) -> dict:
    """The machine a run measured: CPU model, cores, OS, Python, package versions (the runtime's,
    and each framework's the run imported), the threads torch uses, the instruction set of the
    kernels it dispatches to and its GPU when the run used them, and `settings` (the backend's own
    choices) when given."""
    cpuinfo = cpuinfo_fields()   # read once for both
    found = {"cpu": cpu_model(cpuinfo), "vector_isa": vector_isa(cpuinfo), "logical_cores": os.cpu_count()}
    if hasattr(os, "sched_getaffinity"):
        found["usable_cores"] = len(os.sched_getaffinity(0))
    found["os"] = platform.platform()
    found["python"] = platform.python_version()
    found["versions"] = {name: _version(name) for name in RUNTIME + FRAMEWORKS
                         if name in RUNTIME or name in sys.modules}
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_num_threads"):
        found["threads"] = {"torch": torch.get_num_threads()}
        try:   # the kernels torch dispatches to, which ATEN_CPU_CAPABILITY can cap (torch >= 2.0)
            found["kernel_isa"] = {"torch": str(torch.backends.cpu.get_cpu_capability())}
        except AttributeError:
            pass
        cuda = getattr(torch, "cuda", None)
        if cuda is not None and cuda.is_initialized():   # only a run that used the GPU names it
            found["gpu"] = cuda.get_device_name()
    if settings:
        found["settings"] = dict(settings)
    return found


def cpuinfo_fields(path: str = "/proc/cpuinfo") -> dict:
    """The first value of each field of /proc/cpuinfo (Linux); {} where there is none."""
    fields = {}
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_model(fields: dict | None = None) -> str:
    """The CPU's model name from /proc/cpuinfo's fields (`cpuinfo_fields`), else what `platform` knows."""
    fields = cpuinfo_fields() if fields is None else fields
    for key in ("model name", "Model", "Hardware"):
        if fields.get(key):
            return fields[key]
    return platform.processor() or platform.machine() or "unknown"


# Widest vector instructions first: what decides whether a tree of 16 tokens costs a CPU about one
# token's step (AVX-512 here) or twice it (AVX2): docs/results.md, the HF verify cost by machine.
_VECTOR_ISAS = (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"), ("sve", "SVE"), ("asimd", "NEON"))


def vector_isa(fields: dict | None = None) -> str | None:
    """The CPU's widest vector instruction set from /proc/cpuinfo's flags (`cpuinfo_fields`), None if unknown."""
    fields = cpuinfo_fields() if fields is None else fields
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    return next((name for flag, name in _VECTOR_ISAS if flag in flags), None)


def _version(module: str) -> str:
    loaded = sys.modules.get(module)
    version = getattr(loaded, "__version__", None)
    if version:
        return str(version)
    try:
        return metadata.version(module)
    except metadata.PackageNotFoundError:
        return "not installed" if loaded is None else "unknown"


def machine_line(found: dict) -> str:
    """A machine (`machine`) in one line, as the bench prints it and docs/results.md shows it."""
    cores = f"{found.get('logical_cores')} logical cores"
    if found.get("usable_cores") not in (None, found.get("logical_cores")):
        cores += f" ({found['usable_cores']} usable)"
    cpu = str(found.get("cpu", "unknown CPU"))
    if found.get("vector_isa"):
        cpu += f" ({found['vector_isa']})"
    parts = [cpu, cores]
    if found.get("gpu"):
        parts.append(str(found["gpu"]))
    parts += [str(found.get("os", "")), f"Python {found.get('python', '?')}"]
    threads, kernel_isa = found.get("threads", {}), found.get("kernel_isa", {})
    for name, version in found.get("versions", {}).items():
        notes = ([f"{threads[name]} threads"] if name in threads else []) + \
            ([f"{kernel_isa[name]} kernels"] if name in kernel_isa else [])
        parts.append(f"{name} {version}" + (f" ({', '.join(notes)})" if notes else ""))
    line = ", ".join(p for p in parts if p)
    settings = found.get("settings")
    if settings:
        line += "; " + ", ".join(f"{k}={v}" for k, v in settings.items())
    return line
