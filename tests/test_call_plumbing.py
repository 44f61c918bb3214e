"""The call plumbing as a user meets it (#86, item 6): a drafter of the documented shape runs, a
misspelt option is a DraftcoreError naming it, a refused `text()` leaves the verifier free, and the
capabilities of a call are read once, in one place."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import draftcore
from draftcore import DraftcoreError, InputError
from draftcore.errors import ConfigError
from fixtures.toy import ToyModel, ToyVerifier
from test_speculate import expected_output

ROOT = Path(__file__).resolve().parent.parent
PROMPT = [3, 1, 4, 1, 5]


class _Request:
    """The DraftRequest docs/usage.md describes: propose, update, finish (it drafts nothing)."""

    propose = staticmethod(lambda context, budget: draftcore.DraftTree.root_only(int(context[-1])))
    update = staticmethod(lambda tokens: None)
    finish = staticmethod(lambda: None)


class DocumentedDrafter:
    """A drafter exactly as docs/usage.md describes it: start(prompt) returns a request; no flag."""

    def start(self, prompt):
        return _Request()


def test_a_drafter_of_the_documented_shape_runs():
    model = ToyModel(vocab_size=32, seed=1)
    result = draftcore.speculate(ToyVerifier(model), PROMPT, max_new_tokens=6, drafter=DocumentedDrafter(),
                                 budget=4)
    assert result.tokens.tolist() == expected_output(model, PROMPT, 6)[0]


def test_a_drafter_of_the_documented_shape_serves_one_request_at_a_time():
    """It does not say concurrent_requests = True, so it is claimed for a request's lifetime."""
    model = ToyModel(vocab_size=32, seed=1)
    drafter = DocumentedDrafter()
    with draftcore.speculate_stream(ToyVerifier(model), PROMPT, max_new_tokens=6, drafter=drafter):
        with pytest.raises(draftcore.BusyError, match="drafter"):
            draftcore.speculate_stream(ToyVerifier(model), PROMPT, max_new_tokens=6, drafter=drafter)


@pytest.mark.parametrize("call", ["session.speculate", "session.stream", "speculate", "speculate_stream"])
def test_a_misspelt_option_names_the_argument_the_value_and_the_accepted_names(call):
    verifier = ToyVerifier(ToyModel(vocab_size=32, seed=2))
    session = draftcore.Session(verifier, budget=2)
    fn = {"session.speculate": session.speculate, "session.stream": session.stream,
          "speculate": lambda p, **kw: draftcore.speculate(verifier, p, **kw),
          "speculate_stream": lambda p, **kw: draftcore.speculate_stream(verifier, p, **kw)}[call]
    with pytest.raises(DraftcoreError) as info:
        fn(PROMPT, max_tokens=3)
    message = str(info.value)
    assert "max_tokens" in message and "3" in message and "max_new_tokens" in message
    assert "Call.of" not in message
    # nothing was taken: the verifier serves the next call
    assert draftcore.speculate(verifier, PROMPT, max_new_tokens=2, budget=2).tokens.shape == (2,)


def test_a_refused_text_stream_leaves_the_verifier_free():
    """The verifier has no decode(): text() is refused at once, and the refusal closes the stream
    (documented in SpeculationStream.text), so the verifier serves the next request."""
    verifier = ToyVerifier(ToyModel(vocab_size=32, seed=3))
    stream = draftcore.speculate_stream(verifier, PROMPT, max_new_tokens=4, budget=2)
    with pytest.raises(ConfigError, match="decode"):
        for _ in stream.text():
            pass
    result = draftcore.speculate(verifier, PROMPT, max_new_tokens=4, budget=2)
    assert result.tokens.shape == (4,)


def test_speculate_and_speculate_stream_share_one_signature():
    import inspect
    one, two = inspect.signature(draftcore.speculate), inspect.signature(draftcore.speculate_stream)
    assert list(one.parameters) == list(two.parameters)
    assert [p.default for p in one.parameters.values()] == [p.default for p in two.parameters.values()]
    assert one.parameters["max_new_tokens"].default == 128


def test_no_protocol_member_is_read_outside_the_capabilities_reader():
    """Every protocol member is read once, by draftcore.capabilities: no other runtime module asks
    an object for one by name (validate.py's check of a tokenizer's encode/decode is no protocol)."""
    from draftcore import capabilities
    members = "|".join((*capabilities.OPTIONAL_MEMBERS, *capabilities.REQUEST_METHODS, "start", "vocab_size",
                        "max_context"))
    read = re.compile(rf"getattr\([^,]+,\s*[\"']({members})[\"']")
    files = [*sorted((ROOT / "draftcore").glob("*.py")), *sorted((ROOT / "draftcore" / "drafters").glob("*.py"))]
    sites = [f"{f.name}:{i}: {line.strip()}" for f in files if f.name not in ("capabilities.py", "validate.py")
             for i, line in enumerate(f.read_text().splitlines(), 1) if read.search(line)]
    assert sites == []


def test_every_optional_member_is_listed_in_protocols():
    from draftcore import capabilities, protocols
    for name in capabilities.OPTIONAL_MEMBERS:
        assert name in protocols.__doc__, name


def test_a_session_reads_none_as_auto_as_speculate_does():
    """"auto" and None are parsed in one place: the session's budget= reads them as speculate's does."""
    session = draftcore.Session(ToyVerifier(ToyModel(vocab_size=32, seed=4)), budget=None)
    assert isinstance(session.budget, draftcore.CostAwareBudget)
