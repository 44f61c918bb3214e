"""What every node of a step's proposal would have done, told to the budget policy for free.

A budget that verifies few or none of the drafter's candidates (a CPU, where a 2-token forward can
cost twice a 1-token one) sees acceptance only where it gambled, and gambles exactly where it was
most optimistic. Yet the tokens emitted in the following steps are the model's own continuation of
each step's root, so whether every proposed candidate, verified or not, would have been accepted is
known a few tokens later, at no cost: a candidate is accepted iff its path from the root is a prefix
of what was emitted (greedy: the model's argmax chain; exact sampling with one-token drafts: a
candidate is accepted iff the sampled token is its token, so the event has the same probability).

The decode loop keeps one `ProposalOutcomes` per request. Each step whose drafter proposed
candidates adds its proposal; once the request has emitted as many tokens as the proposal's deepest
candidate needs (or the request ends), the policy's optional

    observe_outcomes(tree, verified, outcome)

is called: `tree` is the proposal's root and candidates (a window left out), its first `verified`
candidates were verified (and already passed to `observe`), and `outcome` (int8, one per node of
`tree`) is 1 where the node would have been accepted, 0 where not, -1 where the request ended
before it could tell. At most 64 proposals wait (a step emits at least one token); past that the
oldest goes untold. A request closed early (a client gone) tells nothing of what is pending.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from .jit import kernels
from .tree import DraftTree


class ProposalOutcomes:
    """Proposals waiting for the tokens that settle their candidates, for one request."""

    @staticmethod
    def of(report) -> "ProposalOutcomes | NoOutcomes":
        """What the loop keeps for a policy whose `observe_outcomes` is `report` (None where it has
        none: draftcore.capabilities): its proposals, else nothing at all."""
        return ProposalOutcomes(report) if report is not None else NoOutcomes()

    MAX_PENDING = 64   # a step emits at least one token: a proposal waits at most its depth in steps

    def __init__(self, report):
        self._report = report            # policy.observe_outcomes
        self._pending: deque = deque()   # (proposal, verified, start in context, tokens needed)
        self._kernels = kernels("draftcore.tree_kernels")

    def add(self, proposal: DraftTree, verified: int, start: int) -> None:
        """This step's `proposal` (lookahead nodes ignored), of which the first `verified`
        candidates were verified; its root's continuation begins at context index `start`."""
        m = proposal.n_candidates
        if m <= 1:
            return
        # A copy: a drafter may build its next tree in the same buffers.
        proposal = DraftTree(proposal.tokens[:m].copy(), proposal.parents[:m].copy(), proposal.depths[:m].copy(),
                             None if proposal.scores is None else proposal.scores[:m].copy())
        self._pending.append((proposal, verified, start, int(proposal.depths.max())))
        if len(self._pending) > self.MAX_PENDING:
            self._pending.popleft()   # bounded: evidence, not output, so the oldest may go untold

    def settle(self, context: np.ndarray, n_context: int, final: bool = False) -> None:
        """Report every pending proposal whose continuation is now long enough (all of them when
        `final`: the request ended, the rest is unknown)."""
        pending = self._pending
        while pending and (final or n_context - pending[0][2] >= pending[0][3]):
            proposal, verified, start, needed = pending.popleft()
            continuation = context[start:min(n_context, start + needed)]
            outcome = self._kernels.would_accept(proposal.tokens, proposal.parents, proposal.depths, len(proposal),
                                                 continuation)
            self._report(proposal, verified, outcome)


class NoOutcomes:
    """ProposalOutcomes for a policy that does not learn from outcomes: keeps nothing."""

    def add(self, proposal: DraftTree, verified: int, start: int) -> None:
        pass

    def settle(self, context: np.ndarray, n_context: int, final: bool = False) -> None:
        pass
