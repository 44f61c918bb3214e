"""One request's drafting as the decode loop sees it: what to verify each step, and the feedback.

    drafting = StepDrafting(request, policy, limits, request_caps, policy_caps)
    tree, proposal = drafting.draft(context, n_past, tokens_wanted)   # the tree to verify
    drafting.observe(tree, node_tokens, path)                         # the request's observe, if any

`request` is what `drafter.start(prompt)` returned (or the drafter itself). The optional members of
the protocols (`DraftRequest.observe`, `lookahead_optional`, `returns_valid_trees`; a policy's
`at_context`, `wants_lookahead` and `keep_lookahead`) come read once (draftcore.capabilities), and
become plain methods here that do nothing where a drafter or policy has nothing to say.
"""
from __future__ import annotations

import numpy as np

from .capabilities import PolicyCapabilities, RequestCapabilities
from .errors import BackendError, InputError
from .tree import DraftTree, check_tree


class StepDrafting:
    """The tree each step verifies: the drafter's proposal cut to the policy's choice and to what one
    verify holds (nodes, cache cells, leaves); a lookahead window that does not fit is dropped whole,
    never cut."""

    def __init__(self, request, policy, limits, request_caps: RequestCapabilities | None = None,
                 policy_caps: PolicyCapabilities | None = None):
        self.request, self.policy, self.limits = request, policy, limits
        caps = RequestCapabilities.of(request) if request_caps is None else request_caps
        policy_caps = PolicyCapabilities.of(policy) if policy_caps is None else policy_caps
        self.update, self.finish = caps.update, caps.finish
        # draftcore's own drafters are trusted to return well-formed trees; anything else is checked.
        self._trusted = caps.returns_valid_trees
        self.observe = caps.observe or _ignore
        # What the loop passes to observe is valid by construction (its own tree of a trusted
        # proposal, the tokens check_node_results passed, the acceptance rule's checked path), so a
        # trusted request that offers it skips its own check: ~25 µs of every step, 0.2 % of a
        # llama.cpp CPU step, spent on a root-only tree it learns nothing from.
        if self._trusted and caps.observe is not None and caps.observe_checked is not None:
            self.observe = caps.observe_checked
        # A request that can leave its lookahead window out is told when the policy wants none.
        self._lookahead_optional = caps.lookahead_optional
        self._wants_lookahead = policy_caps.wants_lookahead or _always
        self._keeps_lookahead = policy_caps.keep_lookahead or _always
        self._at_context = policy_caps.at_context or _ignore

    def draft(self, context: np.ndarray, n_past: int, tokens_wanted: int) -> tuple[DraftTree, DraftTree]:
        """(the tree to verify this step, the drafter's whole proposal), for `context` (int32, ending
        with the root), `n_past` cached tokens and `tokens_wanted` more tokens to generate."""
        policy, limits = self.policy, self.limits
        root = int(context[-1])
        cells = min(limits.max_context - n_past, limits.max_tree_nodes)   # nodes one verify may hold
        room = min(tokens_wanted - 1, cells - 1)                          # candidates worth drafting
        self._at_context(n_past)
        size = min(policy.request_size(), room)
        if size <= 0:
            tree = DraftTree.root_only(root)
            return tree, tree
        if self._lookahead_optional and not self._wants_lookahead():
            tree = self.request.propose(context, size, lookahead=False)
        else:
            tree = self.request.propose(context, size)
        if not self._trusted:
            _check_proposal(tree, root, size, limits.vocab_size)
        if tree.n_lookahead and 1 + tree.n_lookahead > cells:
            tree = tree.without_lookahead()
        keep = min(policy.choose(tree), room, cells - 1 - tree.n_lookahead)
        # Leaves are counted only for a window the policy keeps: where verify is not free (a CPU) the
        # window is dropped nearly every step, and counting cost a llama.cpp step ~1 % for nothing.
        if tree.n_lookahead and (not self._keeps_lookahead(tree, keep) or (
                limits.max_tree_leaves is not None and tree.leaf_counts()[1] > limits.max_tree_leaves)):
            tree = tree.without_lookahead()
            keep = min(policy.choose(tree), room, cells - 1)   # priced again: the window's nodes are gone
        return tree.fitted(keep, limits.max_tree_leaves), tree


def _ignore(*args) -> None:
    pass


def _always(*args) -> bool:
    return True


def _check_proposal(tree, root, request, vocab_size) -> None:
    """Full check of a tree from a drafter that is not draftcore's own."""
    try:
        check_tree(tree, vocab_size)
    except InputError as exc:
        raise BackendError(f"drafter.propose: returned a malformed tree: {exc}") from None
    if tree.tokens[0] != root:
        raise BackendError(f"drafter.propose: tree root {int(tree.tokens[0])} is not the last context token {root}")
    if tree.n_draft > request:
        raise BackendError(f"drafter.propose: returned {tree.n_draft} drafted candidates, more than the budget {request}")
