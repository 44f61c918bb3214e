"""draftcore as a user installs it: the wheel, into a fresh venv that already holds a torch.

    the wheel          built once from a copy of this tree (pip wheel --no-deps --no-build-isolation):
                       draftcore and its adapters, no tests, no test fixtures
    beside a torch     a fresh venv whose site-packages reaches this interpreter's torch, transformers
                       and their dependencies (only those draftcore[hf] needs) through a .pth file:
                       `pip install <wheel>[hf]` (offline) installs draftcore alone and keeps that torch,
                       and the README's HF quickstart runs from the installed wheel, outside the tree
    another torch      a venv whose torch is a newer release, or a CUDA build (metadata only, no
                       second torch downloaded): pip's dry run plans draftcore and no torch; a wheel
                       pinning torch==2.13.0 (as the hf extra once did) fails the same check

pip runs without this machine's configuration (no index, no find-links, no global constraints), as
a user's pip would see only what is installed.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

try:
    import venv  # noqa: F401

    import pip  # noqa: F401
except ImportError as exc:  # pragma: no cover - a Python without pip or venv
    pytest.skip(f"needs pip and venv: {exc}", allow_module_level=True)

ROOT = Path(__file__).resolve().parent.parent
PY_DIR = f"python{sys.version_info.major}.{sys.version_info.minor}"
EXTRA = "hf"
# what a source checkout holds beside the package; none of it goes into the build copy
NOT_COPIED = (".git", ".venv*", "__pycache__", "build", "dist", "*.egg-info", "bench_out", ".gpu*",
              ".pytest_cache", ".hypothesis", ".whl", ".gl", "docs", "benchmarks")


def pip_env() -> dict:
    """The environment of a pip run: none of this machine's pip configuration or Python paths."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PIP_") and k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONNOUSERSITE="1")
    return env


def run(args, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=pip_env(), **kwargs)
    assert done.returncode == 0, f"{' '.join(map(str, args))} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done


def pip(target_python, *args) -> subprocess.CompletedProcess:
    """This interpreter's pip, acting on the environment of `target_python` (which has no pip)."""
    return run([sys.executable, "-m", "pip", "--python", target_python, *args])


# ---------------------------------------------------------------------------------------------- the wheel

@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """draftcore's wheel, built offline from a copy of the working tree (so no build/ lands in it)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*NOT_COPIED), symlinks=True)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "-q", "-w", tmp / "dist", src])
    (built,) = (tmp / "dist").glob("draftcore-*.whl")
    return built


def version_of(wheel_path: Path) -> str:
    return wheel_path.name.split("-")[1]


def wheel_requires(wheel_path: Path) -> list[str]:
    with zipfile.ZipFile(wheel_path) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        text = z.read(name).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def test_wheel_holds_the_package_and_no_tests(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    parts = [Path(n).parts for n in names]
    assert {p[0] for p in parts} == {"draftcore", wheel.name.split("-py")[0] + ".dist-info"}
    for package in ("draftcore/__init__.py", "draftcore/drafters/__init__.py", "draftcore/tools/cli.py",
                    *(f"draftcore/adapters/{a}/__init__.py" for a in ("torch_hf", "llamacpp", "onnx", "vllm"))):
        assert package in names
    assert not [n for n, p in zip(names, parts) if "fixtures" in p or "tests" in p or "conftest.py" in p]


def test_hf_extra_names_ranges_not_a_build(wheel):
    """Every framework requirement of [hf] admits several releases: no `==`, an upper bound."""
    from packaging.requirements import Requirement
    hf = [Requirement(r) for r in wheel_requires(wheel) if f'extra == "{EXTRA}"' in r]
    assert {r.name for r in hf} >= {"torch", "transformers"}
    for r in hf:
        assert not any(s.operator in ("==", "===") for s in r.specifier), r
        assert any(s.operator in ("<", "<=") for s in r.specifier), f"{r}: no upper bound"


# ------------------------------------------------------------------------------------ beside another torch

def hf_closure(wheel_path: Path) -> list[metadata.Distribution]:
    """The installed distributions the wheel's draftcore[hf] needs (its requirements, theirs, ...),
    read from this interpreter's metadata (the torch, transformers, numpy and numba installed here)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    todo = [(Requirement(r), EXTRA) for r in wheel_requires(wheel_path)]
    found: dict[str, metadata.Distribution] = {}
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        if name in found or name == "draftcore":
            continue
        dist = metadata.distribution(req.name)   # PackageNotFoundError: the hf extra is not installed here
        found[name] = dist
        todo += [(Requirement(r), e) for r in dist.requires or () for e in (req.extras or {""})]
    return list(found.values())


def overlay(folder: Path, dists, skip=()) -> Path:
    """A folder of symlinks to the installed files of `dists` (less the names in `skip`): this
    interpreter's packages, without the ones draftcore[hf] does not need (draftcore's own editable
    install among them)."""
    folder.mkdir(parents=True)
    for dist in dists:
        if dist.metadata["Name"].lower() in skip:
            continue
        site = Path(dist.locate_file(""))
        tops = {Path(str(f)).parts[0] for f in dist.files or ()}   # RECORD lists the .dist-info folder too
        for top in tops:
            if top != ".." and not (folder / top).exists() and (site / top).exists():
                (folder / top).symlink_to(site / top)
    return folder


def fresh_venv(path: Path, beside: Path) -> Path:
    """A venv without pip whose site-packages reaches `beside` through a .pth file; its python."""
    run([sys.executable, "-m", "venv", "--without-pip", path])
    python = path / "bin" / "python"
    assert site_of(python).is_dir()
    (site_of(python) / "beside.pth").write_text(f"{beside}\n")
    return python


def site_of(python: Path) -> Path:
    """The site-packages folder of the venv whose interpreter is `python`."""
    return python.parent.parent / "lib" / PY_DIR / "site-packages"


def metadata_only(name: str, version: str, extra: str) -> dict:
    """{path: text} of a distribution of `name` `version` that holds no files but its .dist-info:
    METADATA, RECORD, and `extra` (INSTALLER for an installed one, WHEEL for a wheel)."""
    info = f"{name}-{version}.dist-info"
    files = {"METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             "INSTALLER": "pip\n",
             "WHEEL": "Wheel-Version: 1.0\nGenerator: test_install\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    names = ("METADATA", extra, "RECORD")
    record = "".join(f"{info}/{n},,\n" for n in names)
    return {f"{info}/{n}": files[n] if n != "RECORD" else record for n in names}


def fake_wheel(folder: Path, name: str, version: str) -> Path:
    """A wheel of `name` `version` holding metadata alone: a release pip could install."""
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as z:
        for path, text in metadata_only(name, version, "WHEEL").items():
            z.writestr(path, text)
    return out


def fake_dist(site: Path, name: str, version: str) -> None:
    """An installed `name` `version`, metadata alone: what pip reads to decide it is there."""
    for path, text in metadata_only(name, version, "INSTALLER").items():
        (site / path).parent.mkdir(exist_ok=True)
        (site / path).write_text(text)


def planned(python: Path, wheel_path: Path, tmp: Path, offer=None) -> list[tuple[str, str]]:
    """(name, version) of what `pip install <wheel>[hf]` would install into `python`'s venv, offline;
    `offer`: a folder of wheels pip may take (--find-links)."""
    report = tmp / f"report-{len(list(tmp.glob('report-*')))}.json"
    links = ["--find-links", offer] if offer else []
    pip(python, "install", "--dry-run", "--no-index", *links, "--report", report, "-q",
        f"draftcore[{EXTRA}] @ {wheel_path.as_uri()}")
    plan = json.loads(report.read_text())["install"]
    return sorted((p["metadata"]["name"], p["metadata"]["version"]) for p in plan)


def inspect(python: Path, cwd: Path, *names) -> dict:
    """{name: (version, location)} as `python` finds them, run from `cwd`."""
    code = ("import json, sys, importlib.metadata as m; print(json.dumps({n: (m.version(n), "
            "str(m.distribution(n).locate_file(''))) for n in sys.argv[1:]}))")
    return json.loads(run([python, "-c", code, *names], cwd=cwd).stdout)


@pytest.fixture(scope="module")
def closure(wheel):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    return hf_closure(wheel)


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> Path:
    """The quickstart's "your model": a tiny random Llama saved as an HF folder with a word-level
    tokenizer (tests/fixtures/tiny_llama.py). SmolLM2 would do too, but its verifier measures its
    kernels for minutes on a busy 2-core machine; what this test checks is the install."""
    from fixtures.tiny_llama import save_tiny_llama
    folder = tmp_path_factory.mktemp("model") / "tiny-llama"
    save_tiny_llama(folder)
    return folder


@pytest.fixture(scope="module")
def torch_on_offer(tmp_path_factory) -> Path:
    """A folder offering torch 2.13.0 (metadata alone), as an index would: pip takes it only if a
    requirement rules out the torch already installed."""
    folder = tmp_path_factory.mktemp("offer")
    fake_wheel(folder, "torch", "2.13.0")
    return folder


def test_wheel_with_hf_keeps_the_torch_there_and_runs_the_quickstart(wheel, closure, hf_folder, torch_on_offer,
                                                                      tmp_path):
    """This interpreter's torch and transformers installed, draftcore not: pip installs the wheel with
    [hf] alone and keeps them; the README's HF quickstart runs from the installed wheel."""
    torch_there = metadata.distribution("torch")
    python = fresh_venv(tmp_path / "venv", overlay(tmp_path / "installed", closure))
    away = tmp_path / "elsewhere"
    away.mkdir()
    before = inspect(python, away, "torch", "transformers")
    assert before["torch"][0] == torch_there.version
    # the source tree's editable draftcore is not there: only the packages draftcore[hf] needs are
    found = run([python, "-c", "import importlib.util as u; print(u.find_spec('draftcore'))"], cwd=away)
    assert found.stdout.strip() == "None"

    assert planned(python, wheel, tmp_path, offer=torch_on_offer) == [("draftcore", version_of(wheel))]
    pip(python, "install", "--no-index", "-q", f"draftcore[{EXTRA}] @ {wheel.as_uri()}")
    after = inspect(python, away, "torch", "transformers", "draftcore")
    assert after["torch"] == before["torch"] and after["transformers"] == before["transformers"]
    site = site_of(python)
    assert Path(after["draftcore"][1]) == site

    from readme_blocks import quickstart
    script = away / "quickstart.py"
    script.write_text("import draftcore\nprint('DRAFTCORE_FILE', draftcore.__file__)\n"
                      + quickstart("hf", hf_folder))
    out = run([python, script], cwd=away, timeout=600).stdout.splitlines()
    assert out[0].startswith("DRAFTCORE_FILE ") and Path(out[0].split(" ", 1)[1]).is_relative_to(site)
    assert [line for line in out[1:] if line.strip()], "the quickstart printed nothing"


def venv_with_torch(tmp_path: Path, closure, version: str) -> Path:
    """A fresh venv holding torch `version` (metadata alone) and the rest of draftcore[hf]'s packages."""
    python = fresh_venv(tmp_path / "venv", overlay(tmp_path / "installed", closure, skip={"torch"}))
    fake_dist(site_of(python), "torch", version)
    assert inspect(python, tmp_path, "torch")["torch"][0] == version
    return python


@pytest.mark.parametrize("other_torch", ["2.15.0", "2.11.0+cu130"])
def test_wheel_with_hf_keeps_another_torch(wheel, closure, torch_on_offer, tmp_path, other_torch):
    """Another torch installed (a newer release; a CUDA build): pip plans draftcore alone, though
    the torch this repository tests (2.13.0) is on offer."""
    python = venv_with_torch(tmp_path, closure, other_torch)
    assert planned(python, wheel, tmp_path, offer=torch_on_offer) == [("draftcore", version_of(wheel))]


def test_a_torch_pin_fails_the_check(wheel, closure, torch_on_offer, tmp_path):
    """The same check catches a wheel whose hf extra pins torch==2.13.0, as it once did: pip plans
    to replace the installed 2.15.0."""
    pinned = repin(wheel, tmp_path / "pinned", "torch==2.13.0")
    python = venv_with_torch(tmp_path, closure, "2.15.0")
    plan = planned(python, pinned, tmp_path, offer=torch_on_offer)
    assert plan == [("draftcore", version_of(wheel)), ("torch", "2.13.0")]


def repin(wheel_path: Path, folder: Path, torch_requirement: str) -> Path:
    """A copy of the wheel whose hf extra requires `torch_requirement` instead of its torch range
    (METADATA rewritten; RECORD's hash of it dropped, which pip accepts)."""
    folder.mkdir()
    out = folder / wheel_path.name
    with zipfile.ZipFile(wheel_path) as src, zipfile.ZipFile(out, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename.endswith(".dist-info/METADATA"):
                lines = data.decode().splitlines(keepends=True)
                lines = [f'Requires-Dist: {torch_requirement}; extra == "{EXTRA}"\n'
                         if line.startswith("Requires-Dist: torch") and f'extra == "{EXTRA}"' in line else line
                         for line in lines]
                data = "".join(lines).encode()
                assert torch_requirement in data.decode()
            elif item.filename.endswith(".dist-info/RECORD"):
                data = "".join(line if "/METADATA," not in line else line.split(",")[0] + ",,\n"
                               for line in data.decode().splitlines(keepends=True)).encode()
            dst.writestr(item, data)
    return out
