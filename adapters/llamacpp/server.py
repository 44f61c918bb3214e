"""llama-cpp-python's OpenAI-compatible server, its model drafting with draftcore.

    python -m draftcore.adapters.llamacpp.server --model model.gguf --flash_attn true --type_k 8 --type_v 8

takes every setting of `python -m llama_cpp.server` (parsed by llama-cpp-python's own code, from
the same pydantic Settings; `--config_file` too) plus `--drafter`, `--max_draft_tokens` and `--budget`, and
answers `GET /extras/draftcore` with the draft model's counts (drafted and accepted tokens). Or in
Python, for an app you mount or run yourself:

    from draftcore.adapters.llamacpp.server import create_app
    from llama_cpp.server.settings import ModelSettings, ServerSettings
    app = create_app(server_settings=ServerSettings(), model_settings=[ModelSettings(model="model.gguf")])
    uvicorn.run(app, host="127.0.0.1", port=8000)

How: llama-cpp-python's `create_app` builds its app and loads the model (its LlamaProxy, which its
routes reach through the `get_llama_proxy` dependency); this module then takes the loaded Llama the
way those routes do and gives it a DraftcoreDraftModel. Nothing of llama-cpp-python's modules or
classes is replaced: the one write is the Llama's own `draft_model` attribute, where its constructor
keeps the `draft_model=` argument. With `logits_all=True` (the server's default, required here) that
Llama is the one `Llama(..., draft_model=...)` builds: the constructor's only other use of a draft
model is to turn on logits_all. The completion routes call `get_llama_proxy` directly rather than
through FastAPI's `Depends`, so `app.dependency_overrides` could not reach them; and the proxy
holds the Llama it loaded, so giving that Llama the draft model is the seam that serves every route.

Refused (ConfigError, before the model loads where the settings are passed here): more than one
model (the proxy swaps in another model, without a draft model, when a request names it),
`draft_model` (llama-cpp-python's prompt lookup: draftcore drafts instead) and `logits_all=False`.

Requests run one at a time (the server's lock), so the one draft model is never asked by two at
once. A client that disconnects mid-stream leaves the generator where it stopped; the draft model
sees the next request's context start afresh and finishes the old request (its trie keeps what was
generated), and llama-cpp-python reuses the cached prefix as it does without a draft model.

Needs `pip install 'llama-cpp-python[server]'` (FastAPI, uvicorn, ...); importing
draftcore.adapters.llamacpp alone never imports this module.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading

from draftcore.errors import ConfigError, DraftcoreError, describe

from .draft_model import DraftcoreDraftModel

try:
    import anyio
    import uvicorn
    from fastapi import Depends
    from llama_cpp.server import app as llama_server
    from llama_cpp.server.cli import add_args_from_model, parse_model_from_args
    from llama_cpp.server.settings import ConfigFileSettings, ModelSettings, ServerSettings, Settings
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(f"draftcore.adapters.llamacpp.server needs llama-cpp-python's server "
                      f"(pip install 'llama-cpp-python[server]'): {exc}") from exc


def create_app(settings: Settings | None = None, server_settings: ServerSettings | None = None,
               model_settings: list[ModelSettings] | None = None, *, draft_model: DraftcoreDraftModel | None = None):
    """llama_cpp.server.app.create_app(settings, server_settings, model_settings), its model drafting
    with `draft_model` (default: a new DraftcoreDraftModel()). Returns the FastAPI app.

    The model is loaded here and checked as speculative_llama checks it (DraftcoreDraftModel.check_llama:
    an InexactBatchWarning where its settings make batches differ from one-token decoding; see
    docs/llamacpp.md). One app per process: llama-cpp-python keeps the served model in a module global.
    """
    if draft_model is None:
        draft_model = DraftcoreDraftModel()
    elif not isinstance(draft_model, DraftcoreDraftModel):
        raise ConfigError(f"draft_model: expected a DraftcoreDraftModel, got {describe(draft_model)}")
    if model_settings is not None:   # refuse before loading what would be refused after
        check_model_settings([m.model_dump() for m in model_settings])
    elif settings is not None and server_settings is None:
        check_model_settings([ModelSettings.model_validate(settings).model_dump()])
    app = llama_server.create_app(settings=settings, server_settings=server_settings, model_settings=model_settings)
    _in_served_proxy(lambda proxy: attach_draft_model(proxy, draft_model))
    app.add_api_route("/extras/draftcore", lambda: draft_model_stats(draft_model), methods=["GET"],
                      dependencies=[Depends(llama_server.authenticate)], tags=["Extras"],
                      summary="draftcore's draft model: steps, drafted and accepted tokens, its checks' figures")
    return app


def draft_model_stats(draft_model: DraftcoreDraftModel) -> dict:
    """What GET /extras/draftcore answers: the draft model's counts since the server started (calls,
    tokens drafted, drafted tokens the model accepted) and its construction checks' figures."""
    return {"drafter": type(draft_model.drafter).__name__, "max_draft_tokens": draft_model.max_draft_tokens,
            "steps": draft_model.steps, "drafted_tokens": draft_model.drafted_tokens,
            "accepted_tokens": draft_model.accepted_tokens, "self_check_error": _plain(draft_model.self_check_error),
            "split_attention_from": _plain(draft_model.split_attention_from),
            "all_logits_slowdown": _plain(draft_model.all_logits_slowdown)}


def _plain(number):
    """A figure as JSON carries it (the checks may give numpy scalars), or None."""
    return None if number is None else number.item() if hasattr(number, "item") else number


def check_model_settings(models: list[dict]) -> None:
    """ConfigError unless `models` (ModelSettings as dicts) are settings a draft model can serve."""
    if len(models) != 1:
        raise ConfigError(f"model_settings: expected one model, got {len(models)} "
                          f"({[m.get('model_alias') or m.get('model') for m in models]}): llama-cpp-python's "
                          f"server loads another model, without a draft model, when a request names it")
    model = models[0]
    if model.get("draft_model") is not None:
        raise ConfigError(f"draft_model: expected None (it asks for llama-cpp-python's prompt lookup; draftcore "
                          f"drafts instead), got {model['draft_model']!r}")
    if model.get("logits_all") is not True:
        raise ConfigError(f"logits_all: expected True (with a draft model llama-cpp-python keeps every "
                          f"position's logits, in a buffer sized for n_ctx positions only with logits_all), "
                          f"got {model.get('logits_all')!r}")


def attach_draft_model(proxy, draft_model: DraftcoreDraftModel) -> None:
    """Give the Llama that llama-cpp-python's LlamaProxy `proxy` loaded `draft_model`, and check it;
    the model is freed when the check raises."""
    try:
        check_model_settings([proxy[alias] for alias in proxy])   # what a config file may have brought
        llm = proxy()   # the default model, loaded by the proxy's constructor: no reload
        llm.draft_model = draft_model   # where Llama(draft_model=...) keeps it (module docstring)
        draft_model.check_llama(llm)
    except BaseException:
        proxy.free()
        raise


def _in_served_proxy(use) -> None:
    """Call use(proxy) with the LlamaProxy llama-cpp-python's routes serve, taken as they take it
    (its `get_llama_proxy`, its locks held). That is an async generator: run in an event loop of its
    own on a helper thread, so create_app works with or without a running loop (uvicorn --factory)."""
    async def enter():
        async with contextlib.asynccontextmanager(llama_server.get_llama_proxy)() as proxy:
            use(proxy)

    failure = []

    def run():
        try:
            anyio.run(enter)
        except BaseException as exc:   # re-raised in the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=run, name="draftcore-attach-draft-model")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


def settings_from_args(args: argparse.Namespace) -> tuple[ServerSettings, list[ModelSettings]]:
    """(server settings, model settings) from the command line, as `python -m llama_cpp.server` reads
    them: from --config_file (or the CONFIG_FILE variable; JSON or YAML) when given, else the options."""
    config_file = os.environ.get("CONFIG_FILE", args.config_file)
    if not config_file:
        return parse_model_from_args(ServerSettings, args), [parse_model_from_args(ModelSettings, args)]
    if not os.path.exists(config_file):
        raise ConfigError(f"config_file: expected an existing file, got {config_file!r}")
    with open(config_file, "rb") as f:
        if config_file.endswith((".yaml", ".yml")):
            import yaml
            config = ConfigFileSettings.model_validate_json(json.dumps(yaml.safe_load(f)))
        else:
            config = ConfigFileSettings.model_validate_json(f.read())
    return ServerSettings.model_validate(config), config.models


def parser() -> argparse.ArgumentParser:
    """llama-cpp-python's server options (from its Settings), --config_file, and draftcore's three."""
    result = argparse.ArgumentParser(
        description="llama-cpp-python's OpenAI-compatible server, drafting with draftcore "
                    "(every option of `python -m llama_cpp.server`, plus --drafter, --max_draft_tokens and --budget)")
    add_args_from_model(result, Settings)
    result.add_argument("--config_file", type=str, help="Path to a config file to load (JSON or YAML).")
    result.add_argument("--drafter", default="trie",
                        help="draftcore's drafter: trie (default), ngram, composite or a registered name")
    result.add_argument("--max_draft_tokens", type=int, default=16,
                        help="the longest chain drafted per step (default: 16)")
    result.add_argument("--budget", type=_budget, default="auto",
                        help="auto (default: chains as long as measured step costs and acceptance say pays, "
                             "none while drafting does not pay) or N: always draft up to N tokens")
    return result


def _budget(text: str):
    """--budget's value: "auto" or a number of tokens (argparse reports the ValueError)."""
    return text if text == "auto" else int(text)


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        server_settings, model_settings = settings_from_args(args)
        draft_model = DraftcoreDraftModel(args.drafter, max_draft_tokens=args.max_draft_tokens, budget=args.budget)
        app = create_app(server_settings=server_settings, model_settings=model_settings, draft_model=draft_model)
    except (DraftcoreError, ValueError) as exc:   # ValueError: pydantic's validation of the settings
        print(f"error: {exc}", file=sys.stderr)
        return 2
    uvicorn.run(app, host=os.getenv("HOST", server_settings.host), port=int(os.getenv("PORT", server_settings.port)),
                ssl_keyfile=server_settings.ssl_keyfile, ssl_certfile=server_settings.ssl_certfile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
