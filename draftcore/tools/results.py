"""docs/results.md, its archive and the README's results block, rendered from benchmarks' JSON (`draftcore results`).

Every figure the documentation shows comes from a benchmark's JSON report (report.py), so the pages are
regenerated, never edited: a figure cannot drift from the command, the date and the machine that
produced it.

What a run measured is read from its report alone (`measurement`): the benchmark (the script or the
`draftcore` subcommand its command ran), the backend, the kind of machine (`machine_kind`: the GPU, else
the CPU's vector instructions), the inputs its command chose (datasets, traces, batch sizes, context
lengths) and the conditions it ran under (kernels capped to an instruction set, a DRAFTCORE_* setting).
Runs of the same measurement are repeats: docs/results.md shows the newest of each, and
docs/results-archive.md every other run. A run of older code measured beside a change on purpose carries
a "predates" note in its report (written by hand: the change), and goes to the archive however new it is.

A result file is named for what it measured, never for the order of runs (`result_name`):

    <benchmark>_<backend>_<machine kind>_<date>.json          bench_hf_cpu-avx512_2026-12-04.json
    <benchmark>_<backend>_<machine kind>_<date>_<slug>.json   floor_hf_cpu-avx512_2026-12-05_avx2-kernels.json

The slug (lowercase words joined by "-", from the command: datasets, a variant) is there only where two
files would share a name, or where the run ran under a condition, which the name then says
(`name_problem` checks a name against its report).

The README holds results tables in marked blocks this module rewrites:

    <!-- results:begin docs/results/NAME.json table=K -->
    (table K of that JSON's report, under a one-line caption: command, date, a link to the page)
    <!-- results:end -->

The JSON path in the marker is relative to the README's folder. A README without a marker is left as it is.
"""
from __future__ import annotations

import glob
import json
import os
import re
import shlex
from collections import namedtuple
from datetime import datetime, timezone

from ..errors import InputError
from .report import KERNEL_ISA_VARIABLES, machine_line, markdown_table

DEFAULT_INPUTS = os.path.join("docs", "results", "*.json")
BEGIN = re.compile(r"^<!-- results:begin (?P<path>\S+) table=(?P<table>\d+) -->\s*$")
END = "<!-- results:end -->"
REPORT_KEYS = ("title", "command", "date", "machine", "tables")
TABLE_KEYS = ("title", "header", "rows")
DATE_FORMATS = ("%Y-%m-%d %H:%M %z", "%Y-%m-%d %H:%M", "%Y-%m-%d")

# The backends a program measures when its command names none (its --backends default, or the one
# backend it runs); a program not listed runs no model's backend (replays, the drafters' own timings).
DEFAULT_BACKENDS = {
    "bench": "hf", "floor": "hf,llamacpp,onnx", "gpu-check": "hf,llamacpp,onnx", "prefill-reuse": "hf,llamacpp",
    "prefill-plans": "hf", "end-to-end-bound": "hf", "hf-kernel-race": "hf", "hf-verify-cost": "hf",
    "model-outputs-value": "hf", "llamacpp-kv-exactness": "llamacpp", "llamacpp-decode-ms": "llamacpp",
    "llamacpp-q41-divergence": "llamacpp", "shared-trie-threads": "tiny-llama", "vllm-proposer": "vllm",
    "vllm-step-cost": "vllm", "serving": "llamacpp", "llamacpp-prompt-cost": "llamacpp", "window-rules": "hf",
    "onnx-verify-cost": "onnx",
}
# The options that name the backends a run measured, each with the backend a word of its value names
# where the word is not a backend's own name: gpu_check's sections are its backends, and serving's
# --server names a server, `transformers serve` running the HF model.
BACKEND_OPTIONS = {"--backend": {}, "--backends": {}, "--sections": {}, "--server": {"transformers": "hf"}}
# An option that turns a program into another benchmark: (program, option) -> the benchmark it measures.
MODES = {("prefill-reuse", "--splits"): "prefill-plans"}      # times the HF prefill's plans instead
# The options that choose what a run measured, each as it reads in a slug; every other option says how
# much (--n, --rounds), where the output goes, or which methods ran beside each other.
SUBJECT_OPTIONS = {
    "--datasets": lambda value: _listed(value),
    "--traces": lambda value: "-".join(_traces_name(path) for path in value.split()),
    "--contexts": lambda value: "contexts-" + _listed(value),
    "--batch": lambda value: "batch-" + _listed(value),
    "--token-cost": lambda value: "token-cost-" + slug(value),
    "--against-plain": lambda value: "against-plain",
    "--model": lambda value: slug(value),
    "--vocab": lambda value: "vocab-" + slug(value),   # SmolLM2 padded (#87): another model, not a repeat
}
GPU_VENDORS = ("nvidia", "amd", "intel")
# words that count runs instead of saying what a run measured: never part of a result's name
RUN_ORDER_WORDS = frozenset("first second third fourth fifth sixth seventh eighth ninth tenth again rerun "
                            "final latest".split())
NAME = re.compile(r"^(?P<base>[^_]+_[^_]+_[^_]+_[^_]+)(?:_(?P<slug>[^_]+))?\.json$")
SLUG = re.compile(r"^[a-z0-9.]+(?:-[a-z0-9.]+)*$")

Command = namedtuple("Command", "environment program options")
Measurement = namedtuple("Measurement", "benchmark backend machine_kind subject conditions")
Run = namedtuple("Run", "path report measurement when")

PAGE_HEADER = """# Results

This page is generated by `draftcore results` from benchmarks' JSON files (in `docs/results/`);
do not edit it by hand: a figure here always comes with the command, the date and the machine that
measured it. It shows the newest run of each measurement (a benchmark on one backend and one kind of
machine, with the same inputs and conditions); every other run is in [{archive}]({archive}),
generated with this page.

To add a run: run a benchmark (`draftcore bench`, `draftcore replay --json`, or a script in
`benchmarks/`, which writes its JSON under `bench_out/`), copy that JSON into `docs/results/` under the
name `draftcore results --name JSON` prints (`<benchmark>_<backend>_<machine kind>_<date>.json`), then
run `draftcore results` again (it also refreshes the results tables in README.md).
"""

ARCHIVE_HEADER = """# Results: older runs

This page is generated by `draftcore results` with [{page}]({page}); do not edit it by hand. It holds
every run that a newer run of the same measurement replaced, and every run of code that a later change
replaced (measured beside the change on purpose); [{page}]({page}) shows the newest run of each
measurement.
"""


def default_inputs() -> list[str]:
    """docs/results/*.json under the current folder, sorted by name."""
    return sorted(glob.glob(DEFAULT_INPUTS))


def archive_path(out: str) -> str:
    """Where the archive goes beside the page `out`: docs/results.md -> docs/results-archive.md."""
    stem, extension = os.path.splitext(out)
    return f"{stem}-archive{extension or '.md'}"


def load_report(path: str) -> dict:
    """The report object of a benchmark's JSON. InputError, naming the file, for a file that cannot
    be read, is not JSON, or holds no complete report."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise InputError(f"results: cannot read {path} as JSON ({exc}); expected a benchmark's JSON file") from None
    report = data.get("report") if isinstance(data, dict) else None
    if not isinstance(report, dict):
        raise InputError(f"results: {path} holds no 'report' object; expected the JSON of a benchmark run by "
                         f"this version's tooling (draftcore bench, draftcore replay --json, benchmarks/*.py)")
    missing = [key for key in REPORT_KEYS if key not in report]
    broken = [i for i, t in enumerate(report.get("tables", [])) if not all(key in t for key in TABLE_KEYS)]
    if missing or broken:
        raise InputError(f"results: {path}'s report lacks {missing or f'title/header/rows in tables {broken}'}; "
                         f"expected {list(REPORT_KEYS)}, each table with {list(TABLE_KEYS)}")
    return report


# --- what a run measured, from its report -----------------------------------------------------------


def slug(text: str) -> str:
    """`text` as a name's word: lowercase letters, digits and dots, other runs of characters as one "-"
    ("_" separates a name's fields, so it never appears inside one)."""
    return re.sub(r"[^a-z0-9.]+", "-", str(text).lower()).strip("-")


def _listed(value: str) -> str:
    """A comma-separated option value as one word, its items sorted: the order they ran in is no part of
    what was measured."""
    return "-".join(sorted(slug(item) for item in value.split(",") if item.strip()))


def _traces_name(path: str) -> str:
    """A traces file by its name: benchmarks/data/smollm2_workload_traces.jsonl.gz -> smollm2-workload."""
    return slug(os.path.basename(path).split(".")[0].removesuffix("_traces"))


def command_words(command: str) -> list[str]:
    """The words of a report's command. A make target records the command it ran in parentheses
    (`make gpu-check  (benchmarks/gpu_check.py --device cuda ...)`): those words are the command's."""
    inner = re.search(r"\((.*)\)\s*$", command)
    text = inner.group(1) if inner else command
    try:
        return shlex.split(text)
    except ValueError:   # an unbalanced quote: still the words, as typed
        return text.split()


def parse_command(command: str) -> Command:
    """A report's command as the variables set before it, the program (a benchmark script's name, or
    the draftcore subcommand) and its options (--name -> the words after it, joined by a space)."""
    words = command_words(command)
    environment = {}
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        name, _, value = words.pop(0).partition("=")
        environment[name] = value
    start = next((i for i, word in enumerate(words)
                  if word.endswith(".py") or os.path.basename(word) == "draftcore"), 0)
    if start < len(words) and words[start].endswith(".py"):
        program, rest = os.path.basename(words[start])[:-len(".py")], words[start + 1:]
    elif start + 1 < len(words):   # draftcore SUBCOMMAND ...
        program, rest = words[start + 1], words[start + 2:]
    else:
        program, rest = (os.path.basename(words[0]) if words else "unknown"), []
    return Command(environment, slug(program), _options(rest))


def _options(words: list[str]) -> dict:
    options, name = {}, None
    for word in words:
        if word.startswith("--"):
            name, _, value = word.partition("=")
            options[name] = [value] if value else []
        elif name is not None:
            options[name].append(word)
    return {name: " ".join(values) for name, values in options.items()}


def benchmark_of(report: dict) -> str:
    """The benchmark a run measured: its script's name (floor, prefill-reuse, ...) or its draftcore
    subcommand (bench, replay); a script's mode that measures something else has its own name."""
    command = parse_command(report["command"])
    return next((mode for (program, option), mode in MODES.items()
                 if program == command.program and option in command.options), command.program)


def backend_of(report: dict) -> str:
    """The backends a run measured, joined by "-" (hf, llamacpp-onnx, vllm): those its command names,
    else its program's (`DEFAULT_BACKENDS`); "none" for a run with no model's backend (a replay)."""
    options = parse_command(report["command"]).options
    named = next((",".join(backends.get(word.strip(), word) for word in options[option].split(","))
                  for option, backends in BACKEND_OPTIONS.items() if options.get(option)), None)
    return _listed(named or DEFAULT_BACKENDS.get(benchmark_of(report), "none"))


def machine_kind(machine: dict) -> str:
    """The kind of machine a report's `machine` describes: its GPU when the run used one (NVIDIA H200 ->
    h200), else cpu-<widest vector instructions> (cpu-avx512, cpu-avx2, cpu-neon), or "cpu" where the
    run predates recording them. The kind decides a run's speed more than the model of the CPU does."""
    if machine.get("gpu"):
        return _gpu_kind(str(machine["gpu"]))
    isa = machine.get("vector_isa")
    return f"cpu-{slug(isa).replace('-', '')}" if isa else "cpu"


def _gpu_kind(name: str) -> str:
    """A GPU's name up to its model number, without the vendor: "NVIDIA H100 80GB HBM3" -> h100,
    "NVIDIA GeForce RTX 4090" -> geforce-rtx-4090."""
    words = []
    for word in name.split():
        if word.lower() in GPU_VENDORS:
            continue
        words.append(word)
        if any(c.isdigit() for c in word):
            break
    return slug("-".join(words)) or "gpu"


def run_date(report: dict) -> str:
    """The day a run was measured, YYYY-MM-DD, as its report's date says."""
    return report_time(report).strftime("%Y-%m-%d")


def report_time(report: dict) -> datetime:
    """When a run was measured (a date without a zone read as UTC). InputError for a date in no format
    a report has been written in."""
    for form in DATE_FORMATS:
        try:
            when = datetime.strptime(str(report["date"]), form)
        except ValueError:
            continue
        return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)
    raise InputError(f"results: report date {report['date']!r} is not 'YYYY-MM-DD HH:MM +ZZZZ' (report.make_report's)")


def subject_of(report: dict) -> tuple:
    """The inputs a run's command chose (`SUBJECT_OPTIONS`), each as a slug, sorted by option."""
    options = parse_command(report["command"]).options
    return tuple(SUBJECT_OPTIONS[name](value) for name, value in sorted(options.items())
                 if name in SUBJECT_OPTIONS and value)


def conditions_of(report: dict) -> tuple:
    """What a run ran under beyond its options: kernels capped to an instruction set (avx2-kernels), a
    DRAFTCORE_* setting (match-cost-inf), and the llama.cpp KV cache type where a report recorded it
    only in its settings (before the command named the variable), sorted."""
    environment = parse_command(report["command"]).environment
    found = {f"{slug(value)}-kernels" for name, value in environment.items() if name in KERNEL_ISA_VARIABLES}
    found |= {slug(f"{name.removeprefix('DRAFTCORE_')}-{value}") for name, value in environment.items()
              if name.startswith("DRAFTCORE_")}
    kv_cache = _recorded_llamacpp_kv_cache(report)
    if kv_cache:
        found.add(slug(f"llamacpp-kv-{kv_cache}"))
    return tuple(sorted(found))


def _recorded_llamacpp_kv_cache(report: dict) -> str | None:
    # the one KV cache type a run's settings name, unless it is llama.cpp's default (f16); a run that
    # compares types (several named) ran under none of them
    settings = json.dumps(report["machine"].get("settings") or {})
    types = set(re.findall(r'kv_cache\\*"\s*:\s*\\*"(\w+)', settings))
    return types.pop() if len(types) == 1 and "f16" not in types else None


def measurement(report: dict) -> Measurement:
    """What a run measured: runs with equal measurements are repeats of one another, and the newest
    stands for them all. A function of the report alone, so a new file is classified as the old were."""
    return Measurement(benchmark_of(report), backend_of(report), machine_kind(report["machine"]),
                       subject_of(report), conditions_of(report))


def predates(report: dict) -> str | None:
    """The change a run was measured before, on purpose, beside the run after it (its report's
    "predates", written by hand where such a run is kept); None for a run of the code as it was."""
    return report.get("predates") or None


def label(measured: Measurement) -> str:
    """A measurement in words: "bench, hf, cpu-avx512, agent"."""
    return ", ".join([measured.benchmark, measured.backend, measured.machine_kind,
                      *measured.subject, *measured.conditions])


# --- names ---------------------------------------------------------------------------------------


def result_name(report: dict, slug_text: str = "") -> str:
    """The file name docs/results/ gives a run: <benchmark>_<backend>_<machine kind>_<date>.json, with
    _<slug> before .json where one is needed (module docstring)."""
    base = "_".join([benchmark_of(report), backend_of(report), machine_kind(report["machine"]), run_date(report)])
    return f"{base}_{slug_text}.json" if slug_text else f"{base}.json"


def name_problem(path: str, report: dict, others: list[str]) -> str | None:
    """What is wrong with the name of the result file `path` (its `report`) beside the names `others`
    in its folder, or None. The name is `result_name`'s for its report, with a slug where another file
    shares its base name or the run ran under a condition, and only there; a slug is words of what was
    measured, never a count of runs (second, fifth)."""
    name = os.path.basename(path)
    base = result_name(report)[:-len(".json")]
    match = NAME.match(name)
    if match is None or match.group("base") != base:
        return f"{name}: expected {base}.json or {base}_<slug>.json (the run's benchmark, backend, machine kind, date)"
    slug_text = match.group("slug")
    if slug_text is not None and _slug_problem(slug_text):
        return f"{name}: {_slug_problem(slug_text)}"
    shared, conditions = _shares_base(name, base, others), conditions_of(report)
    if slug_text is None and (shared or conditions):
        why = "another run shares that name" if shared else f"the run ran under {', '.join(conditions)}"
        return f"{name}: expected {base}_<slug>.json: {why}"
    if slug_text is not None and not (shared or conditions):
        return f"{name}: expected {base}.json: no other run shares that name, so it needs no slug"
    return None


def _slug_problem(slug_text: str) -> str | None:
    if not SLUG.match(slug_text):
        return f"the slug {slug_text!r} is not lowercase words joined by '-'"
    counted = RUN_ORDER_WORDS.intersection(slug_text.split("-"))
    return f"the slug counts runs ({', '.join(sorted(counted))}); name what the run measured" if counted else None


def _shares_base(name: str, base: str, others: list[str]) -> bool:
    """Whether a file of `others` other than `name` has the base name `base`, with or without a slug."""
    return any(other != name and (other == base + ".json" or other.startswith(base + "_"))
               for other in map(os.path.basename, others))


# --- which runs the page shows -------------------------------------------------------------------


def load_runs(paths: list[str]) -> list[Run]:
    """Each JSON's run: its path, report, measurement and time."""
    runs = []
    for path in paths:
        report = load_report(path)
        runs.append(Run(path, report, measurement(report), report_time(report)))
    return runs


def newest_runs(runs: list[Run]) -> tuple[list[Run], list[Run]]:
    """(the newest run of each measurement, every other run), each newest first. Newest by the report's
    date, ties by the file's name; a run that `predates` a change is never the newest, since it did not
    measure the code as it is."""
    current, older = {}, []
    for run in sorted(runs, key=lambda run: (run.when, os.path.basename(run.path)), reverse=True):
        if predates(run.report) is None and run.measurement not in current:
            current[run.measurement] = run
        else:
            older.append(run)
    return list(current.values()), older


# --- the pages -----------------------------------------------------------------------------------


def render_pages(paths: list[str], out: str) -> tuple[str, str]:
    """(docs/results.md, its archive): the newest run of each measurement in `paths`, and every other
    run, each page grouped by benchmark under an index (links relative to `out`'s folder)."""
    current, older = newest_runs(load_runs(paths))
    page_name, archive_name = os.path.basename(out), os.path.basename(archive_path(out))
    folder = os.path.dirname(os.path.abspath(out))
    return (_render_page(current, _by_measurement(older), archive_name, folder),
            _render_archive(older, {run.measurement for run in current}, page_name, folder))


def _render_page(current: list[Run], older_by_measurement: dict, archive_name: str, folder: str) -> str:
    page = [PAGE_HEADER.format(archive=archive_name)]
    page += _current_index(current, older_by_measurement, archive_name) if current else ["No runs yet.\n"]
    for benchmark, runs in _by_benchmark(current):
        page.append(f"## {benchmark}\n")
        page += [_current_section(run, older_by_measurement.get(run.measurement, []), archive_name, folder)
                 for run in runs]
    return "\n".join(page)


def _render_archive(older: list[Run], shown: set, page_name: str, folder: str) -> str:
    """The archive: `older` runs by benchmark and measurement; `shown`: the measurements the page shows."""
    archive = [ARCHIVE_HEADER.format(page=page_name)]
    archive += _archive_index(_by_measurement(older)) if older else ["No older runs.\n"]
    for benchmark, runs in _by_benchmark(older):
        archive.append(f"## {benchmark}\n")
        archive += [_archive_group(measured, group, measured in shown, page_name, folder)
                    for measured, group in _by_measurement(runs).items()]
    return "\n".join(archive)


def _by_benchmark(runs: list[Run]) -> list[tuple[str, list[Run]]]:
    """(benchmark, its runs) by benchmark name; runs by measurement, then newest first."""
    grouped = {}
    for run in sorted(runs, key=lambda run: (run.measurement, -run.when.timestamp(), run.path)):
        grouped.setdefault(run.measurement.benchmark, []).append(run)
    return sorted(grouped.items())


def _by_measurement(runs: list[Run]) -> dict:
    """measurement -> its runs, in the order given."""
    grouped = {}
    for run in runs:
        grouped.setdefault(run.measurement, []).append(run)
    return grouped


def anchor(heading: str) -> str:
    """The link anchor GitHub gives a heading: lowercase, punctuation dropped, spaces as "-"."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.lower()).replace(" ", "-")


INDEX_HEADER = ["benchmark", "backend", "machine", "inputs, conditions"]


def _measurement_cells(measured: Measurement) -> list[str]:
    """A measurement as the first cells of an index row (`INDEX_HEADER`)."""
    return [measured.benchmark, measured.backend, measured.machine_kind,
            ", ".join(measured.subject + measured.conditions) or "–"]


def _current_index(current: list[Run], older_by_measurement: dict, archive_name: str) -> list[str]:
    rows = []
    for _, runs in _by_benchmark(current):
        for run in runs:
            older, target = older_by_measurement.get(run.measurement, []), anchor(label(run.measurement))
            rows.append(_measurement_cells(run.measurement) + [
                f"[{run_date(run.report)}](#{target})", f"[{len(older)}]({archive_name}#{target})" if older else "0"])
    return ["## Index\n", markdown_table(INDEX_HEADER + ["newest run", "older runs"], rows) + "\n"]


def _archive_index(older_by_measurement: dict) -> list[str]:
    rows = []
    for _, runs in _by_benchmark([run for group in older_by_measurement.values() for run in group]):
        for measured, group in _by_measurement(runs).items():
            rows.append(_measurement_cells(measured) + [f"[{len(group)}](#{anchor(label(measured))})"])
    return ["## Index\n", markdown_table(INDEX_HEADER + ["runs"], rows) + "\n"]


def _current_section(run: Run, older: list[Run], archive_name: str, folder: str) -> str:
    heading = label(run.measurement)
    lines = [f"### {heading}", "", *_run_lines(run, folder)]
    if older:
        lines.insert(-1, f"- older runs: [{len(older)} in the archive]({archive_name}#{anchor(heading)})")
    return "\n".join(lines + _tables(run.report))


def _archive_group(measured: Measurement, runs: list[Run], has_newest: bool, page_name: str, folder: str) -> str:
    heading = label(measured)
    newest = (f"The newest run: [{page_name}]({page_name}#{anchor(heading)})." if has_newest
              else "Every run of this measurement predates a change; none is on " + page_name + ".")
    parts = [f"### {heading}\n\n{newest}\n"]
    for run in runs:
        parts.append("\n".join([f"#### {os.path.basename(run.path)[:-len('.json')]}", "", *_run_lines(run, folder)]
                               + _tables(run.report)))
    return "\n".join(parts)


def _run_lines(run: Run, folder: str) -> list[str]:
    """A run's title, command, date, machine, the change it predates, and its data file, then a blank line."""
    report, link = run.report, os.path.relpath(os.path.abspath(run.path), folder)
    lines = [f"**{report['title']}**", "",
             f"- command: `{report['command']}`",
             f"- date: {report['date']}",
             f"- machine: {machine_line(report['machine'])}"]
    if predates(report):
        lines.append(f"- predates: {predates(report)}")
    return lines + [f"- data: [{link}]({link})", ""]


def _tables(report: dict) -> list[str]:
    lines = []
    for kept in report["tables"]:
        if kept["title"]:
            lines += [f"**{kept['title']}**", ""]
        lines += [markdown_table(kept["header"], kept["rows"]), ""]
    return lines


# --- the README's results blocks ------------------------------------------------------------------


def refresh_readme(text: str, readme: str, page: str) -> str:
    """`text` (the README at path `readme`) with every results block rewritten from the JSON its
    marker names; `page` is the results page the captions link to. Text outside the blocks is kept
    as it is. InputError, naming the README's line, for a block without an end or a missing table."""
    lines = text.splitlines(keepends=True)
    out, i = [], 0
    while i < len(lines):
        match = BEGIN.match(lines[i].rstrip("\n"))
        out.append(lines[i])
        if match is None:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == END), None)
        if end is None:
            raise InputError(f"readme: {readme} line {i + 1} opens a results block that no {END!r} line closes")
        out.append(_block(match, readme, page, i + 1))
        out.append(lines[end])
        i = end + 1
    return "".join(out)


def _block(match, readme: str, page: str, line: int) -> str:
    folder = os.path.dirname(os.path.abspath(readme))
    try:
        report = load_report(os.path.join(folder, match.group("path")))
    except InputError as exc:
        raise InputError(f"readme: {readme} line {line} names {match.group('path')}: {exc}") from None
    k = int(match.group("table"))
    if k >= len(report["tables"]):
        raise InputError(f"readme: {readme} line {line} asks for table={k} of {match.group('path')}, which has "
                         f"{len(report['tables'])} table(s) (expected 0 <= table < {len(report['tables'])})")
    kept = report["tables"][k]
    link = os.path.relpath(os.path.abspath(page), folder)
    caption = (f"{kept['title'] + ': ' if kept['title'] else ''}measured by `{report['command']}` on "
               f"{report['date']}; the machine, and every other run: [{link}]({link}).")
    return f"{caption}\n\n{markdown_table(kept['header'], kept['rows'])}\n\n"


def write_results(paths: list[str], out: str, readme: str | None) -> list[str]:
    """Write the page to `out`, the archive beside it (`archive_path`), and refresh `readme`'s results
    blocks (None: no README); return the paths written. Everything is rendered before anything is
    written, so an error leaves every file as it was; a README whose text does not change is not rewritten."""
    page, archive = render_pages(paths, out)
    text = refreshed = None
    if readme is not None:
        try:
            with open(readme) as f:
                text = f.read()
        except OSError as exc:
            raise InputError(f"readme: cannot read {readme} ({exc}); expected a README file") from None
        refreshed = refresh_readme(text, readme, out)
    written = []
    for path, content in ((out, page), (archive_path(out), archive)):
        with open(path, "w") as f:
            f.write(content)
        written.append(path)
    if refreshed != text:
        with open(readme, "w") as f:
            f.write(refreshed)
        written.append(readme)
    return written
