"""What `generate()` prepared, translated into draftcore's options — or refused by name.

transformers hands a decoding loop its prepared `GenerationConfig`, the `LogitsProcessorList` and
`StoppingCriteriaList` it built from the config and the user's arguments, and the model kwargs.
Each piece is honoured exactly or refused, never ignored:

    logits processors
      RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,    draftcore's own processing
      TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper            (SamplingParams)
      PREFIX_FUNCTIONS below (no_repeat_ngram_size, bad_words_ids,   applied at every drafted node
      min_new_tokens, suppress_tokens, ...: pure functions of          with that node's prefix
      (input_ids, scores)); a user's processor when the call says      (SamplingParams.logits_processors)
      pure_logits_processors=True
      LogitNormalization (renormalize_logits)                        dropped: a log-softmax changes
                                                                       neither the argmax nor sampling
      anything else (typical_p, epsilon/eta cutoffs, top_h,          refused, naming the option
      guidance, watermarking, a user processor not declared pure)
    stopping criteria
      MaxLengthCriteria, EosTokenCriteria                           max_new_tokens, eos_token_id
      anything else (StopStringCriteria, MaxTimeCriteria, a user's)  checked after every token
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from transformers.generation import logits_process as lp
from transformers.generation import stopping_criteria as sc

from draftcore import ConfigError, SamplingParams
from draftcore.errors import describe

# transformers' own processors that are pure functions of (input_ids, scores): exact per tree node.
PREFIX_FUNCTIONS = (
    lp.SequenceBiasLogitsProcessor, lp.NoRepeatNGramLogitsProcessor, lp.NoBadWordsLogitsProcessor,
    lp.MinLengthLogitsProcessor, lp.MinNewTokensLengthLogitsProcessor, lp.PrefixConstrainedLogitsProcessor,
    lp.ForcedBOSTokenLogitsProcessor, lp.ForcedEOSTokenLogitsProcessor, lp.InfNanRemoveLogitsProcessor,
    lp.ExponentialDecayLengthPenalty, lp.SuppressTokensLogitsProcessor, lp.SuppressTokensAtBeginLogitsProcessor,
)
_WARPERS = (lp.TemperatureLogitsWarper, lp.TopKLogitsWarper, lp.TopPLogitsWarper, lp.MinPLogitsWarper)
# The GenerationConfig option behind each processor draftcore cannot apply exactly, for the message.
_OPTION_OF = {
    "TypicalLogitsWarper": "typical_p", "EpsilonLogitsWarper": "epsilon_cutoff", "EtaLogitsWarper": "eta_cutoff",
    "TopHLogitsWarper": "top_h", "UnbatchedClassifierFreeGuidanceLogitsProcessor": "guidance_scale",
    "ClassifierFreeGuidanceLogitsProcessor": "guidance_scale", "WatermarkLogitsProcessor": "watermarking_config",
    "SynthIDTextWatermarkLogitsProcessor": "watermarking_config",
    "EncoderRepetitionPenaltyLogitsProcessor": "encoder_repetition_penalty",
    "EncoderNoRepeatNGramLogitsProcessor": "encoder_no_repeat_ngram_size",
}
# transformers 5.24 renamed the cache argument `past_key_values` to `cache`; both names are accepted (empty).
_CACHE_KWARGS = ("cache", "past_key_values")
_MODEL_KWARGS = {"attention_mask", "position_ids", "logits_to_keep", "use_cache", "cache_position", *_CACHE_KWARGS}


@dataclass
class DecodeOptions:
    """A generate() call in draftcore's terms."""

    max_new_tokens: int
    eos_token_id: list[int]
    sampling: SamplingParams
    checks: list = field(default_factory=list)   # criteria evaluated after every token


def translate(input_ids, logits_processor, stopping_criteria, generation_config, model_kwargs,
              pure_logits_processors: bool) -> DecodeOptions:
    """Raise ConfigError naming the first option draftcore cannot honour exactly."""
    _refuse_unsupported_config(generation_config)
    _refuse_unsupported_inputs(input_ids, model_kwargs)
    native, functions = _split_processors(logits_processor or [], pure_logits_processors)
    max_length, eos, checks = _split_criteria(stopping_criteria or [])
    if max_length is None:
        max_length = generation_config.max_length
    sample = bool(generation_config.do_sample)
    seed = None
    if sample:
        # torch's generator picks the seed, so torch.manual_seed(...) replays a call as it does plain sampling.
        seed = int(torch.randint(0, 2 ** 62, (1,)).item())
    sampling = SamplingParams(
        do_sample=sample,
        temperature=native.get(lp.TemperatureLogitsWarper, 1.0),
        top_k=native.get(lp.TopKLogitsWarper), top_p=native.get(lp.TopPLogitsWarper, 1.0),
        min_p=native.get(lp.MinPLogitsWarper), repetition_penalty=native.get(lp.RepetitionPenaltyLogitsProcessor, 1.0),
        seed=seed, logits_processors=tuple(_as_prefix_function(p, input_ids.device) for p in functions))
    return DecodeOptions(max_new_tokens=int(max_length) - int(input_ids.shape[1]), eos_token_id=eos,
                         sampling=sampling, checks=checks)


def _refuse_unsupported_config(config) -> None:
    refused = {
        "num_beams": (config.num_beams or 1) > 1,
        "num_return_sequences": (config.num_return_sequences or 1) > 1,
        "prompt_lookup_num_tokens": config.prompt_lookup_num_tokens is not None,
        "assistant_early_exit": getattr(config, "assistant_early_exit", None) is not None,
    }
    for name, is_set in refused.items():
        if is_set:
            raise ConfigError(f"generation_config.{name}={getattr(config, name)!r}: speculative_generate decodes one "
                              f"sequence with draftcore's own drafts; leave {name} unset")
    if config.return_dict_in_generate:
        for name in ("output_scores", "output_logits", "output_attentions", "output_hidden_states"):
            if getattr(config, name, False):
                raise ConfigError(f"generation_config.{name}=True: speculative_generate returns sequences only "
                                  f"(a verified tree's scores are not one row per token); leave {name} unset")


def _refuse_unsupported_inputs(input_ids, model_kwargs) -> None:
    if input_ids.ndim != 2 or input_ids.shape[0] != 1:
        raise ConfigError(f"input_ids: shape {tuple(input_ids.shape)}; speculative_generate decodes one sequence "
                          f"(batch 1: shape [1, n]); call generate once per sequence")
    if input_ids.shape[1] == 0:
        raise ConfigError("input_ids: empty (inputs_embeds are not supported); pass the prompt's token ids")
    unknown = sorted(set(model_kwargs) - _MODEL_KWARGS)
    if unknown:
        raise ConfigError(f"generate: model input(s) {unknown} are not supported by speculative_generate "
                          f"(it feeds the model token ids only)")
    mask = model_kwargs.get("attention_mask")
    if mask is not None and not bool((mask == 1).all()):
        raise ConfigError("attention_mask: has padding (zeros); speculative_generate takes one unpadded sequence")
    for name in _CACHE_KWARGS:
        cache = model_kwargs.get(name)
        if cache is not None and hasattr(cache, "get_seq_length") and cache.get_seq_length() > 0:
            raise ConfigError(f"{name}: a filled cache was passed; speculative_generate keeps its own KV cache "
                              f"(pass the whole sequence as input_ids instead)")


def _split_processors(processors, pure_logits_processors: bool):
    """({native warper/penalty class: value}, [processors to apply per node]) in transformers' order,
    which draftcore's must reproduce: repetition penalty, then the functions, then the warpers."""
    native, functions = {}, []
    stage = 0   # 0: before any function, 1: functions, 2: warpers
    for processor in processors:
        kind = type(processor)
        if isinstance(processor, lp.RepetitionPenaltyLogitsProcessor) and kind is lp.RepetitionPenaltyLogitsProcessor:
            if stage > 0 or processor.prompt_ignore_length:
                raise ConfigError(_refusal(processor, "repetition_penalty together with sequence_bias or with "
                                                      "prompt_ignore_length"))
            native[kind] = processor.penalty
        elif kind in _WARPERS:
            if getattr(processor, "min_tokens_to_keep", 1) != 1 or getattr(processor, "filter_value", -np.inf) != -np.inf:
                raise ConfigError(_refusal(processor, "min_tokens_to_keep or filter_value other than the defaults"))
            stage = 2
            native[kind] = {lp.TemperatureLogitsWarper: "temperature", lp.TopKLogitsWarper: "top_k",
                            lp.TopPLogitsWarper: "top_p", lp.MinPLogitsWarper: "min_p"}[kind]
            native[kind] = getattr(processor, native[kind])
        elif kind is lp.LogitNormalization:
            continue
        elif kind in PREFIX_FUNCTIONS or (pure_logits_processors and kind.__name__ not in _OPTION_OF
                                          and not kind.__module__.startswith("transformers.")):
            if stage == 2:
                raise ConfigError(_refusal(processor, "a logits processor after the sampling warpers"))
            stage = 1
            functions.append(processor)
        else:
            option = _OPTION_OF.get(kind.__name__)
            if option is not None:
                raise ConfigError(f"generation_config.{option}: its {kind.__name__} is not supported by "
                                  f"speculative_generate (draftcore applies temperature, top_k, top_p, min_p and "
                                  f"repetition_penalty exactly); leave {option} unset")
            raise ConfigError(
                f"logits_processor: {describe(processor)} is not known to be a pure function of (input_ids, "
                f"scores), and speculative_generate applies processors once per drafted node with that node's "
                f"prefix; if it is one, pass pure_logits_processors=True to generate()")
    return native, functions


def _refusal(processor, what: str) -> str:
    return f"logits_processor: {type(processor).__name__}: {what} is not supported by speculative_generate"


def _split_criteria(criteria):
    """(max_length or None, eos ids, criteria to evaluate after every token)."""
    max_length, eos, checks = None, [], []
    for criterion in criteria:
        if type(criterion) is sc.MaxLengthCriteria:
            max_length = criterion.max_length if max_length is None else min(max_length, criterion.max_length)
        elif type(criterion) is sc.EosTokenCriteria:
            eos.extend(int(t) for t in criterion.eos_token_id.reshape(-1).tolist())
        else:
            checks.append(criterion)
    return max_length, sorted(set(eos)), checks


def _as_prefix_function(processor, device):
    """A transformers LogitsProcessor as draftcore's fn(prefix, logits) on one row, run on the
    device generate() built it for (its token tensors live there)."""
    def apply(prefix: np.ndarray, logits: np.ndarray) -> np.ndarray:
        input_ids = torch.from_numpy(np.ascontiguousarray(prefix, np.int64))[None, :].to(device)
        scores = torch.from_numpy(np.array(logits, np.float32))[None, :].to(device)
        return processor(input_ids, scores)[0].cpu().numpy()
    apply.__qualname__ = f"per-node {type(processor).__name__}"
    return apply
