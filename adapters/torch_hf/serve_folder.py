"""`transformers serve` through draftcore, with no change to transformers: a model folder whose
`custom_generate/generate.py` is draftcore's.

    python -m draftcore.adapters.torch_hf.serve_folder MODEL_FOLDER SERVE_FOLDER
    transformers serve SERVE_FOLDER --trust-remote-code

transformers' own mechanism does the rest. `from_pretrained(folder, trust_remote_code=True)` finds the
folder's `custom_generate/generate.py` and makes its `generate` the model's `generate`
(`GenerationMixin.adjust_generation_fn`, transformers/generation/utils.py), and `transformers serve`
loads its models with `from_pretrained(..., trust_remote_code=--trust-remote-code)`
(`ModelLoader._load_model`, transformers/cli/serving/model_manager.py) and answers every chat, text
completion and Responses request with `model.generate(...)` (`GenerateRunner.generate`,
transformers/cli/serving/utils.py). That `generate` is `generate` below: transformers' own generate()
with `custom_generate=speculative_generate`.

SERVE_FOLDER links to MODEL_FOLDER's files (nothing is copied) and adds `custom_generate/generate.py`,
two lines that import `generate` from here. A request may pass draftcore's options in its
`generation_config` JSON: `{"budget": 0}`, `{"drafter": "composite"}` (a name of DRAFTER_NAMES).
"""
from __future__ import annotations

import argparse
import copy
import os
from pathlib import Path

from draftcore import ConfigError

from .generate import speculative_generate

GENERATE_PY = '''"""draftcore's speculative decoding as this model's generate() (draftcore.adapters.torch_hf.serve_folder)."""
from draftcore.adapters.torch_hf.serve_folder import generate  # noqa: F401
'''


def generate(*args, model, custom_generate=None, **kwargs):
    """The model's `generate` once a serve folder is loaded with trust_remote_code: transformers' own
    generate() (its preparation, processors, stopping criteria, streamer) with draftcore's decoding
    loop, `speculative_generate`, instead of its own. transformers binds it as
    `functools.partial(generate, model=model)`, so `model` is keyword-only and `model.generate(ids)`
    works as usual.

    Stop strings become a StopStringCriteria built with the call's `tokenizer=` (which `transformers
    serve` passes): generate() gives a callable `custom_generate` no tokenizer, so it would refuse
    `stop_strings` (a request's "stop") otherwise."""
    if custom_generate is not None:
        raise ConfigError(f"custom_generate: this model's generate() is draftcore's already (its folder's "
                          f"custom_generate/generate.py); got another, {custom_generate!r}; leave it unset")
    kwargs = _stop_strings_as_criteria(kwargs)
    return type(model).generate(model, *args, custom_generate=speculative_generate, **kwargs)


def _stop_strings_as_criteria(kwargs: dict) -> dict:
    from transformers import StoppingCriteriaList, StopStringCriteria

    stop_strings = kwargs.pop("stop_strings", None)
    config = kwargs.get("generation_config")
    if config is not None and getattr(config, "stop_strings", None) is not None:
        config = kwargs["generation_config"] = copy.deepcopy(config)   # the caller's is left as it was
        stop_strings = stop_strings if stop_strings is not None else config.stop_strings
        config.stop_strings = None
    if not stop_strings:
        return kwargs
    tokenizer = kwargs.get("tokenizer")
    if tokenizer is None:
        raise ConfigError(f"stop_strings: {stop_strings!r} needs the tokenizer to match them; pass "
                          f"tokenizer= to generate() as well (transformers serve does)")
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)   # a processor's own tokenizer
    criteria = StoppingCriteriaList(kwargs.get("stopping_criteria") or [])
    criteria.append(StopStringCriteria(tokenizer, stop_strings))
    kwargs["stopping_criteria"] = criteria
    return kwargs


def write_serve_folder(model_folder, serve_folder) -> Path:
    """Make `serve_folder`: links to each entry of the local HF model folder `model_folder` (weights,
    config, tokenizer, chat template) and a `custom_generate/generate.py` that runs draftcore. Returns
    its path. `serve_folder` must be new, empty, or one this function made (then its links are
    remade, following `model_folder`'s files as they are now)."""
    source = Path(model_folder).expanduser().resolve()
    if not (source / "config.json").is_file():
        raise ConfigError(f"model_folder: expected a local HF model folder with a config.json, got {str(model_folder)!r}")
    if (source / "custom_generate").exists():
        raise ConfigError(f"model_folder: {str(model_folder)!r} has a custom_generate/ of its own, which "
                          f"draftcore's would replace; expected a folder without one")
    target = Path(serve_folder).expanduser().absolute()
    if target.resolve() == source:
        raise ConfigError(f"serve_folder: expected a folder other than model_folder, got {str(serve_folder)!r}")
    ours = target / "custom_generate" / "generate.py"
    if target.exists() and any(target.iterdir()) and not (ours.is_file() and ours.read_text() == GENERATE_PY):
        raise ConfigError(f"serve_folder: expected a new or empty folder (or one write_serve_folder made), "
                          f"got {str(serve_folder)!r}, which holds other files")
    target.mkdir(parents=True, exist_ok=True)
    for entry in target.iterdir():   # the links of an earlier run, some of which may be gone from the source
        if entry.is_symlink():
            entry.unlink()
    for entry in sorted(source.iterdir()):
        os.symlink(entry, target / entry.name, target_is_directory=entry.is_dir())
    ours.parent.mkdir(exist_ok=True)
    ours.write_text(GENERATE_PY)
    return target


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m draftcore.adapters.torch_hf.serve_folder",
        description="Make a model folder that `transformers serve` runs through draftcore's speculative decoding.")
    parser.add_argument("model_folder", help="a local HF model folder (config.json, weights, tokenizer)")
    parser.add_argument("serve_folder", help="the folder to make: links to model_folder's files, and "
                                             "custom_generate/generate.py")
    args = parser.parse_args(argv)
    folder = write_serve_folder(args.model_folder, args.serve_folder)
    print(folder)
    print(f"serve it with:  transformers serve {folder} --trust-remote-code")


if __name__ == "__main__":
    main()
