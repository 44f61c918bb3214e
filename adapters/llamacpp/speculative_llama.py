"""`SpeculativeLlama`: a `llama_cpp.Llama` that drafts with draftcore and asks llama.cpp only for the
logits its sampler reads.

    from draftcore.adapters.llamacpp import speculative_llama
    llm = speculative_llama("model.gguf", n_ctx=4096)   # a llama_cpp.Llama: create_completion, chat, ...

A plain `Llama(draft_model=...)` turns `logits_all` on: llama.cpp computes the output head for every
row of every batch, the prompt's included, and `Llama.eval` copies each row into `Llama.scores`
(n_ctx x n_vocab floats). On a 128k-262k vocabulary that makes a prompt several times slower than
plain decoding's. Yet llama-cpp-python (0.3.x) samples inside llama.cpp: `Llama.sample` calls
`llama_sampler_sample(ctx, idx - n_tokens)`, a negative index among the LAST llama_decode's output
rows, and `Llama.generate` samples
  * after its first eval (the prompt, or the part of it past the cached prefix): the last row only;
  * after every later eval ([the model's token] + the drafted chain): every row, in turn.
So this subclass keeps llama-cpp-python's own `generate` (its verify loop, untouched), and its `eval`
asks llama.cpp for exactly those rows, copying none: the prompt's batches as a plain
`Llama(logits_all=False)` evaluates them (the same rows, the same logits), and a step's batch with
every row. Outside `generate` (a chat handler calling `eval` itself) it evaluates as a plain Llama.

Built with logits_all=True (for logprobs) every eval is llama-cpp-python's own: every row computed and
copied, as a plain `Llama(logits_all=True)` does.
"""
from __future__ import annotations

from llama_cpp import Llama
from llama_cpp.llama_speculative import LlamaDraftModel

from draftcore import ConfigError
from draftcore.errors import describe
from draftcore.validate import flag

from .draft_model import DraftcoreDraftModel


class SpeculativeLlama(Llama):
    """A llama_cpp.Llama drafting with `draft_model` (default: a new DraftcoreDraftModel) whose
    evaluations compute only the logits rows its sampler reads (module docstring).

    model_path, **kwargs: as llama_cpp.Llama (n_ctx, n_batch, n_threads, flash_attn, chat_format, ...).
    draft_model: a DraftcoreDraftModel or any llama-cpp-python LlamaDraftModel.
    logits_all: False (default): no n_ctx x n_vocab buffer is written, and `logprobs` is refused by
        llama-cpp-python (ValueError naming it), as for any Llama built without it. True: every row is
        computed and copied, as llama-cpp-python does, and logprobs are honoured.

    A DraftcoreDraftModel checks this Llama at construction (DraftcoreDraftModel.check_llama: the batch
    self-check, and that one step fits one llama_decode: max_draft_tokens <= n_batch - 1); the Llama
    is closed when a check raises.
    """

    def __init__(self, model_path, *, draft_model=None, logits_all=False, **kwargs):
        if draft_model is None:
            draft_model = DraftcoreDraftModel()
        elif not isinstance(draft_model, LlamaDraftModel):
            raise ConfigError(f"draft_model: expected a DraftcoreDraftModel or a llama_cpp LlamaDraftModel, got "
                              f"{describe(draft_model)}")
        logits_all = flag("logits_all", logits_all)
        self._generate_call = None        # the running generate call (a token), None outside generate
        self._prompt_evaluated = False    # ... past its first eval, the prompt
        # No draft_model here: llama-cpp-python turns logits_all on whenever it is given one.
        super().__init__(model_path, logits_all=logits_all, **kwargs)
        self.draft_model = draft_model    # what Llama.generate drafts with
        if isinstance(draft_model, DraftcoreDraftModel):
            try:
                draft_model.check_llama(self)
            except BaseException:
                self.close()
                raise

    def __del__(self):
        if hasattr(self, "_stack"):   # else refused before Llama.__init__ ran: nothing to free
            super().__del__()

    def generate(self, tokens, *args, **kwargs):
        """llama_cpp.Llama.generate, unchanged; this wrapper only tells `eval` that the call's first
        evaluation is its prompt (when the generator starts running, not when it is created)."""
        call = self._generate_call = object()
        self._prompt_evaluated = False
        try:
            return (yield from super().generate(tokens, *args, **kwargs))
        finally:
            # An abandoned stream's generator may be closed (garbage-collected) during a later call:
            # it must not end that one.
            if self._generate_call is call:
                self._generate_call = None

    def eval(self, tokens):
        """Evaluate `tokens` after the cached ones, computing the logits rows generate samples next:
        a step's every row, a prompt's last (module docstring)."""
        every_row = self._asks_every_row()
        self._prompt_evaluated = self._generate_call is not None
        if every_row and len(tokens) > self.n_batch:
            # The sampler reads the last llama_decode's rows only, so a step must be one decode. A
            # DraftcoreDraftModel is refused at construction instead (check_llama); another draft
            # model's longer chain is cut, which only drafts less: generate verifies what was evaluated.
            tokens = tokens[:self.n_batch]
        if self._logits_all:
            return super().eval(tokens)
        # llama-cpp-python's Llama.eval (0.3.36), with the output rows chosen and no copy into `scores`
        self._ctx.kv_cache_seq_rm(-1, self.n_tokens, -1)
        for start in range(0, len(tokens), self.n_batch):
            batch = tokens[start:start + self.n_batch]
            n_past = self.n_tokens
            self._batch.set_batch(batch=batch, n_past=n_past, logits_all=every_row)   # else the last row
            self._ctx.decode(self._batch)
            self.input_ids[n_past:n_past + len(batch)] = batch
            self.n_tokens += len(batch)
            self._requires_eval = False

    def _asks_every_row(self) -> bool:
        """Whether the next eval is a step of generate (every row sampled), not its prompt or an eval
        from outside generate (the last row sampled, as in a plain Llama)."""
        return self._generate_call is not None and self._prompt_evaluated


def speculative_llama(model_path, *, draft_model=None, **llama_kwargs) -> SpeculativeLlama:
    """A llama_cpp.Llama that drafts with draftcore: `SpeculativeLlama(model_path,
    draft_model=draft_model, **llama_kwargs)` (its docstring), checked before it returns.

    draft_model: a DraftcoreDraftModel (default: a new one) or any llama-cpp-python LlamaDraftModel.
    llama_kwargs: any other argument of llama_cpp.Llama (n_ctx, n_threads, flash_attn, ...).
        logits_all=False (default): a prompt is evaluated as without a draft model, and a verify step
        computes the rows the draft check reads; no n_ctx x n_vocab buffer. logits_all=True: every
        row computed and copied, for logprobs.
    A DraftcoreDraftModel's batch self-check runs here, so its InexactBatchWarning points at this
    call; ConfigError where max_draft_tokens + 1 exceeds n_batch, BackendError where batches are
    broken beyond the check's tolerance (the Llama is closed when any check raises).
    """
    return SpeculativeLlama(model_path, draft_model=draft_model, **llama_kwargs)
