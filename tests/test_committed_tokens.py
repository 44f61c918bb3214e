"""CommittedTokens (draftcore/committed_tokens.py): the record behind the verifiers' prefix reuse."""
import numpy as np
import pytest

from draftcore.committed_tokens import CommittedTokens
from draftcore.errors import ConfigError


def test_shared_prefix_counts_matching_cached_tokens_but_never_the_last_prompt_token():
    record = CommittedTokens(1000)
    assert record.shared_prefix(np.arange(10, dtype=np.int32), 0) == 0      # nothing recorded
    record.record(np.arange(10, dtype=np.int32), 0)
    prompt = np.arange(12, dtype=np.int32)
    assert record.shared_prefix(prompt, 10) == 10
    assert record.shared_prefix(prompt, 6) == 6                 # only what the cache still holds
    assert record.shared_prefix(prompt[:10], 10) == 9           # the last token always runs
    assert record.shared_prefix(prompt[:1], 10) == 0
    changed = prompt.copy()
    changed[4] = 99
    assert record.shared_prefix(changed, 10) == 4


def test_record_overwrites_from_its_position_and_grows_to_capacity():
    record = CommittedTokens(700)
    record.record(np.arange(300, dtype=np.int32), 0)            # past the first 256
    record.record(np.array([7, 7], np.int32), 100)              # a new sequence diverging at 100
    prompt = np.r_[np.arange(100), 7, 7, 5].astype(np.int32)
    assert record.shared_prefix(prompt, 102) == 102
    record.record(np.zeros(600, np.int32), 100)                 # up to exactly the capacity
    with pytest.raises(ValueError):
        record.record(np.zeros(2, np.int32), 699)               # a position past max_context


def test_record_one_equals_record_of_one_token_also_where_it_grows():
    one, many = CommittedTokens(600), CommittedTokens(600)
    for at, token in enumerate(np.arange(300, dtype=np.int32) % 97):   # past the first 256
        one.record_one(int(token), at)
        many.record(np.array([token], np.int32), at)
    prompt = np.r_[np.arange(300) % 97, 5].astype(np.int32)
    assert one.shared_prefix(prompt, 300) == many.shared_prefix(prompt, 300) == 300


def test_capacity_must_be_positive():
    with pytest.raises(ConfigError, match="capacity"):
        CommittedTokens(0)
