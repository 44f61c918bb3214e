"""A verify runs the fastest of its forwards, measured per context length
(adapters/torch_hf/fastest_forward.py): a step without drafts between generate()'s forward and the
split head, and on CUDA in fp16/bf16 each forward against its twin without cuDNN's attention
(attention_backends.py); whichever is kept gives generate()'s tokens."""
from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import draftcore  # noqa: E402
from draftcore.adapters.torch_hf import HFVerifier  # noqa: E402
from draftcore.adapters.torch_hf import attention_backends, verifier as verifier_module  # noqa: E402
from draftcore.adapters.torch_hf.fastest_forward import (  # noqa: E402
    RECHECK_EVERY, RECHECK_SHARE, TRIALS, WINDOW, FastestForward, bucket_range, context_bucket)
from fixtures.tiny_llama import tiny_llama  # noqa: E402


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def timed_forwards(clock, seconds):
    """Forwards that advance `clock` by seconds[name](n_past) and log their calls."""
    calls = []

    def make(name):
        def forward(token, n_past):
            calls.append((name, n_past))
            clock.now += seconds[name](n_past)
            return name
        return forward

    return {name: make(name) for name in seconds}, calls


def split_kept(contexts=(0,)):
    """A chooser of generate() (50 ms) and the split (40 ms) that has finished its trials at each of
    `contexts` (so keeps the split there), with its calls log emptied."""
    clock = FakeClock()
    forwards, calls = timed_forwards(clock, {"generate": lambda n: 0.050, "split": lambda n: 0.040})
    chooser = FastestForward(forwards, clock)
    for start in contexts:
        for n_past in range(start, start + 2 * TRIALS):
            chooser(None, n_past)
    calls.clear()
    return chooser, calls


def test_buckets_are_powers_of_two_with_short_contexts_together():
    assert [context_bucket(n) for n in (0, 1, 255, 256, 511, 512, 1000, 3000)] == [8, 8, 8, 9, 9, 10, 10, 12]
    assert bucket_range(8) == "0-255" and bucket_range(10) == "512-1023"


def test_each_bucket_alternates_then_keeps_the_faster():
    """Split faster at short contexts, generate()'s forward faster past 1,024 tokens (as on a CPU
    where the split's kernels stop paying): each bucket keeps its own winner after TRIALS each."""
    clock = FakeClock()
    forwards, calls = timed_forwards(clock, {"generate": lambda n: 0.050,
                                             "split": lambda n: 0.040 if n < 1024 else 0.060})
    chooser = FastestForward(forwards, clock)
    for n_past in range(100, 100 + 2 * TRIALS + 5):
        chooser(None, n_past)
    tried = [name for name, _ in calls[:2 * TRIALS]]
    assert tried == ["generate", "split"] * TRIALS
    assert [name for name, _ in calls[2 * TRIALS:]] == ["split"] * 5
    for n_past in range(2000, 2000 + 2 * TRIALS + 5):
        chooser(None, n_past)
    assert [name for name, _ in calls[-5:]] == ["generate"] * 5
    assert chooser.choices() == {"0-255": "split", "1024-2047": "generate"}


def test_one_slow_trial_does_not_decide():
    """The median of each forward's trials decides: one stall of the faster one is outvoted."""
    clock = FakeClock()
    stalls = iter([0.5])
    forwards, _ = timed_forwards(clock, {"generate": lambda n: 0.050,
                                         "split": lambda n: next(stalls, 0.040)})
    chooser = FastestForward(forwards, clock)
    for n_past in range(2 * TRIALS):
        chooser(None, n_past)
    assert chooser.choices() == {"0-255": "split"}


def test_a_choice_that_turned_slower_is_changed_by_the_rechecks():
    """The split won its trials, then its calls slowed (say another process took a core): the
    re-checks see it and the bucket moves to generate()'s forward within a window of them."""
    clock = FakeClock()
    slow = {"now": False}
    forwards, calls = timed_forwards(clock, {"generate": lambda n: 0.050,
                                             "split": lambda n: 0.060 if slow["now"] else 0.040})
    chooser = FastestForward(forwards, clock)
    for n_past in range(2 * TRIALS):
        chooser(None, n_past)
    assert chooser.choices() == {"0-255": "split"}
    slow["now"] = True
    calls_to_switch = None
    for call in range(WINDOW * (RECHECK_EVERY + 1)):
        chooser(None, 100)
        if chooser.choices() == {"0-255": "generate"}:
            calls_to_switch = call + 1
            break
    assert calls_to_switch is not None, "the rechecks never moved off the forward that turned slower"
    assert calls_to_switch <= (TRIALS + 1) * (RECHECK_EVERY + 1)
    assert chooser.switches == 1
    calls.clear()
    for _ in range(RECHECK_EVERY - 1):
        chooser(None, 100)
    # what follows runs generate()'s forward, but for at most the second half of the re-check pair
    assert sum(name == "split" for name, _ in calls) <= 1 and calls[-1][0] == "generate"


def test_a_right_choice_costs_one_call_of_the_other_per_recheck():
    chooser, calls = split_kept()
    rechecks = 10
    for _ in range(rechecks * (RECHECK_EVERY + 1)):
        chooser(None, 100)
    assert sum(name == "generate" for name, _ in calls) == rechecks
    assert chooser.choices() == {"0-255": "split"} and chooser.switches == 0


def test_a_much_slower_forward_is_rechecked_seldom_enough_to_cost_one_percent():
    """cuDNN's attention on an H200 made a bf16 tree verify ~3x its twin's: re-checking that every
    64 calls would cost ~3 %; the interval grows so that the slower calls stay within RECHECK_SHARE."""
    clock = FakeClock()
    forwards, calls = timed_forwards(clock, {"tree": lambda n: 0.090, "tree without cuDNN": lambda n: 0.030})
    chooser = FastestForward(forwards, clock)
    for n_past in range(2 * TRIALS + RECHECK_EVERY + 1):   # the trials and the first re-check
        chooser(None, n_past % 200)
    calls.clear()
    start = clock.now
    for _ in range(20 * 200):
        chooser(None, 100)
    challenged = sum(name == "tree" for name, _ in calls)
    assert 0 < challenged <= 20
    extra = challenged * (0.090 - 0.030)
    assert extra / (clock.now - start) <= RECHECK_SHARE * 1.05
    assert chooser.choices() == {"0-255": "tree without cuDNN"}


def test_rechecks_challenge_every_other_forward_in_turn_and_ties_keep_the_choice():
    """Three forwards (CUDA: generate, split, generate without cuDNN): each re-check times the kept
    one and the next of the others; an equally fast challenger does not take the bucket."""
    clock = FakeClock()
    forwards, calls = timed_forwards(clock, {"a": lambda n: 0.050, "b": lambda n: 0.040, "c": lambda n: 0.040})
    chooser = FastestForward(forwards, clock)
    for n_past in range(3 * TRIALS):
        chooser(None, n_past)
    assert chooser.choices() == {"0-255": "b"}   # b and c tie: the earlier one
    calls.clear()
    for _ in range(4 * (RECHECK_EVERY + 1)):
        chooser(None, 100)
    challengers = [name for name, _ in calls if name != "b"]
    assert challengers == ["a", "c", "a", "c"]
    assert chooser.choices() == {"0-255": "b"} and chooser.switches == 0


def test_each_bucket_rechecks_on_its_own_calls():
    """Re-checks count a bucket's own calls: calls at another context neither advance nor trigger them."""
    chooser, calls = split_kept(contexts=(0, 300))
    for _ in range(RECHECK_EVERY):
        chooser(None, 100)
        chooser(None, 400)
    assert calls.count(("generate", 100)) == 0 and calls.count(("generate", 400)) == 0
    chooser(None, 100)
    assert calls[-1] == ("generate", 100)


def test_a_single_forward_is_never_timed():
    def clock():
        raise AssertionError("timed")
    chooser = FastestForward({"generate": lambda token, n_past: n_past}, clock)
    assert [chooser(None, n) for n in (1, 300, 5000)] == [1, 300, 5000]
    assert chooser.choices() == {}


@pytest.mark.parametrize("attn", ["sdpa", "eager", "draftcore_sdpa"])
@pytest.mark.parametrize("kept", ["generate", "split"])
def test_no_draft_steps_equal_generate_whichever_forward_is_kept(attn, kept):
    """budget=0 runs one-node verifies only: with either forward kept at every context, and with
    the two alternating (a fresh verifier measuring), the tokens are generate()'s."""
    model = tiny_llama(seed=0, attn_implementation=attn)
    rng = np.random.default_rng(3)
    prompt = rng.integers(2, model.config.vocab_size, 300).astype(np.int32)   # spans two buckets
    with torch.inference_mode():
        ids = torch.from_numpy(prompt).long()[None]
        want = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=40,
                              eos_token_id=1, pad_token_id=1)[0, 300:].numpy()
    assert len(want) >= 20
    measuring = HFVerifier(model)
    got = draftcore.speculate(measuring, prompt, max_new_tokens=40, budget=0, eos_token_id=1).tokens
    assert got.tolist() == want.tolist()
    assert set(measuring.one_token_choices) == {"256-511"}
    forced = HFVerifier(model)
    forced._one_token.chosen = {bucket: kept for bucket in range(8, 20)}
    calls = []
    forward = forced._one_token.forwards[kept]
    forced._one_token.forwards[kept] = lambda token, n_past: calls.append(n_past) or forward(token, n_past)
    got = draftcore.speculate(forced, prompt, max_new_tokens=40, budget=0, eos_token_id=1).tokens
    assert got.tolist() == want.tolist()
    assert len(calls) == len(want) - 1   # every step after the prefill went through the kept forward


def test_no_draft_steps_through_rechecks_and_a_switch_equal_generate():
    """A long budget-0 run in one bucket re-checks its choice several times, and a clock that makes
    the kept forward look slower moves the bucket mid-request: the tokens stay generate()'s."""
    model = tiny_llama(seed=0)
    rng = np.random.default_rng(4)
    prompt = rng.integers(2, model.config.vocab_size, 40).astype(np.int32)
    new_tokens = 3 * (RECHECK_EVERY + 1) + 2 * TRIALS + 10
    with torch.inference_mode():
        ids = torch.from_numpy(prompt).long()[None]
        want = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                              max_new_tokens=new_tokens, eos_token_id=None, pad_token_id=1)[0, 40:].numpy()
    verifier = HFVerifier(model)
    chooser = verifier._one_token
    clock = FakeClock()
    chooser.clock = clock
    ran = []
    for name, forward in list(chooser.forwards.items()):
        def counted(token, n_past, name=name, forward=forward):
            ran.append(name)
            clock.now += 0.040 if name == "split" and len(ran) <= 2 * TRIALS else 0.050
            clock.now += 0.030 if name == "split" and len(ran) > 2 * TRIALS else 0.0
            return forward(token, n_past)
        chooser.forwards[name] = counted
    got = draftcore.speculate(verifier, prompt, max_new_tokens=new_tokens, budget=0).tokens
    assert got.tolist() == want.tolist()
    assert chooser.switches == 1 and verifier.one_token_choices == {"0-255": "generate"}
    assert ran[2 * TRIALS:].count("split") >= 2   # the split ran after its trials, then lost the bucket


def test_a_trial_waits_for_its_result_before_the_clock_is_read():
    """On a GPU a forward returns before its kernels finish: `wait` runs inside the timed region,
    so what it waits for is counted; outside the trials it is not called."""
    clock = FakeClock()
    forwards, _ = timed_forwards(clock, {"tree": lambda n: 0.010, "tree without cuDNN": lambda n: 0.010})
    waited = []

    def wait(result):
        waited.append(result)
        clock.now += 0.030 if result == "tree" else 0.0   # the queued kernels of "tree" take longer

    chooser = FastestForward(forwards, clock, wait=wait)
    for n_past in range(2 * TRIALS + 3):
        chooser(None, n_past)
    assert chooser.choices() == {"0-255": "tree without cuDNN"}
    assert len(waited) == 2 * TRIALS


def test_cudnn_twins_only_where_cudnn_attention_could_run():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    enabled = torch.backends.cuda.cudnn_sdp_enabled()
    assert attention_backends.cudnn_attention_may_run(cuda, torch.bfloat16, "sdpa") == enabled
    assert attention_backends.cudnn_attention_may_run(cuda, torch.float16, "draftcore_sdpa") == enabled
    assert not attention_backends.cudnn_attention_may_run(cuda, torch.float32, "sdpa")
    assert not attention_backends.cudnn_attention_may_run(cuda, torch.bfloat16, "eager")
    assert not attention_backends.cudnn_attention_may_run(cpu, torch.bfloat16, "sdpa")
    assert set(HFVerifier(tiny_llama(seed=0)).kernel_choices) == {"split_head", "linear_ways",
                                                                  "packed_linear", "one_token",
                                                                  "one_token_switches"}


def test_without_cudnn_restricts_sdpa_inside_the_call_only():
    seen = []
    restricted = attention_backends.without_cudnn(
        lambda x: seen.append((torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.math_sdp_enabled())) or x)
    before = torch.backends.cuda.cudnn_sdp_enabled()
    assert restricted(7) == 7
    assert seen == [(False, True)]
    assert torch.backends.cuda.cudnn_sdp_enabled() == before


def test_first_only_runs_the_first_forward_untimed_and_keeps_the_choices():
    """A diagnosis pins the first forward for a block; the race's choices hold again after it."""
    chooser, calls = split_kept()
    assert chooser.choices() == {"0-255": "split"}
    with chooser.first_only():
        assert [chooser(None, n) for n in (10, 300, 5000)] == ["generate"] * 3
    assert chooser.choices() == {"0-255": "split"}   # nothing new was timed or chosen
    assert chooser(None, 20) == "split"


@pytest.mark.parametrize("kept,context", [(None, 70), ("tree", 70), ("tree without cuDNN", 70), (None, 700)])
def test_trees_through_either_twin_equal_generate(monkeypatch, kept, context):
    """The twins' code path, on this CPU (as if cuDNN's attention could run here): speculative
    greedy output equals generate()'s with the tree forward raced (None) or either one kept; at
    700 tokens of context the race runs again in each new bucket (256-511, 512-1023)."""
    monkeypatch.setattr(verifier_module, "cudnn_attention_may_run", lambda *args: True)
    model = tiny_llama(seed=0, max_position=1024)
    rng = np.random.default_rng(5)
    block = rng.integers(2, model.config.vocab_size, 30)
    filler = rng.integers(2, model.config.vocab_size, context - 70)
    prompt = np.concatenate([filler, block, block, block[:10]]).astype(np.int32)   # drafts that get accepted
    with torch.inference_mode():
        ids = torch.from_numpy(prompt).long()[None]
        want = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=40,
                              eos_token_id=1, pad_token_id=1)[0, prompt.shape[0]:].numpy()
    verifier = HFVerifier(model)
    assert list(verifier._trees.forwards) == ["tree", "tree without cuDNN"]
    assert "generate without cuDNN" in verifier._one_token.forwards
    if kept is not None:
        verifier._trees.chosen = {bucket: kept for bucket in range(8, 20)}
    result = draftcore.speculate(verifier, prompt, max_new_tokens=40, budget=8, eos_token_id=1)
    assert result.tokens.tolist() == want.tolist()
    assert sum(k * c for k, c in enumerate(result.stats.accepted_hist)) > 0   # trees were verified and used
    if kept is None and context > 512:
        assert "512-1023" in verifier.kernel_choices["tree"]
