"""Where the tooling finds backends: a name -> the module holding a backend's bench hooks.

This package holds the tooling's every harness that names an adapter: the hooks of draftcore's own
backends (hf.py, llamacpp.py, onnx.py), sharing prompts.py (the token ids every backend runs) and
default_model.py (where each finds SmolLM2's weights); demo.py (`make demo`); vllm_engine.py (vLLM
engines for the proposer's tests and benchmark).

A backend module offers the hooks `draftcore bench` and `draftcore record` call:

    load_model(model_path, **options) -> (model, tokenizer)
    load_prompts(tokenizer, dataset, n) -> list[bench.Prompt]
    make_methods(model, tokenizer, names) -> list[bench.Method]
    plain_greedy(model, tokenizer, prompt_ids, max_new_tokens) -> int32 output ids
    load_tokenizer(model_path=None) -> tokenizer        optional (canonical traces)
    encode_request(tokenizer, request) -> token ids     optional (a user's own prompts, bench --prompts:
                                                        a text, or a chat's list of {"role", "content"})
    model_settings(model) -> dict                       optional (recorded in the bench's JSON)

Backends are declared as entry points of the group "draftcore.backends" (draftcore's own in its
pyproject.toml; another package can add one the same way), or registered at run time with
`register_backend`. This registry names no backend module itself, and the runtime never imports
this package.
"""
from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from types import ModuleType

from ...errors import BackendError, ConfigError

GROUP = "draftcore.backends"
REQUIRED_HOOKS = ("load_model", "load_prompts", "make_methods", "plain_greedy")

_registered: dict[str, str] = {}  # run-time registrations; they take precedence over entry points


def register_backend(name: str, module_path: str) -> None:
    """Make `load_backend(name)` import `module_path` (a dotted module name)."""
    for argument, value in (("name", name), ("module_path", module_path)):
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{argument}: expected a non-empty string, got {value!r}")
    _registered[name] = module_path


def backend_modules() -> dict[str, str]:
    """Every known backend: name -> module path, sorted by name."""
    found = {ep.name: ep.module for ep in entry_points(group=GROUP)}
    found.update(_registered)
    return dict(sorted(found.items()))


def backend_names() -> list[str]:
    return list(backend_modules())


def load_backend(name: str) -> ModuleType:
    """The module of backend `name`, imported, with its hooks checked.

    ConfigError for an unknown name (the message lists the known ones); BackendError when the
    backend's module cannot be imported (its framework is not installed) or lacks a hook.
    """
    modules = backend_modules()
    if name not in modules:
        raise ConfigError(f"backend: expected one of {list(modules)}, got {name!r}")
    try:
        module = importlib.import_module(modules[name])
    except ImportError as exc:
        raise BackendError(f"backend: {name!r} ({modules[name]}) cannot be imported: {exc}; "
                           f"is its extra installed (pip install 'draftcore[{name}]')?") from exc
    missing = [hook for hook in REQUIRED_HOOKS if not callable(getattr(module, hook, None))]
    if missing:
        raise BackendError(f"backend: {name!r} ({modules[name]}) lacks the hook(s) {missing}; "
                           f"expected {list(REQUIRED_HOOKS)}")
    return module
