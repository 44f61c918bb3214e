"""Slow, obviously-correct pure-Python twins of draftcore's jitted code (stumpy's tests/naive.py).

Tests run the real thing and the twin on the same inputs and require the same answer. The twins
use dicts and lists, walk from the root instead of keeping a `front`, search linearly instead of
keeping heaps and child lists, and share nothing with draftcore but the documented constants.

    NaiveTrie            the trie drafter's counting / pruning / elimination / retrieval rules
    naive_trie_contents  {token path: (PROMPT, OUTPUT)} of a NaiveTrie
    pool_contents        the same mapping read from a TrieDrafter's node-pool arrays
    naive_child_order    {token path: child tokens in the order of the pool's child lists}
    pool_child_order     the same read from the pool
    naive_branch_counts  OUTPUT counts straight from the definition (no capacity pressure)
    naive_greedy_accept  greedy acceptance of one verified tree
"""
from __future__ import annotations

import numpy as np

F32 = np.float32
HEAP_CAPACITY = 1 << 12  # draftcore.drafters.trie_kernels.HEAP_CAPACITY: most candidates kept at once


# -- the trie ---------------------------------------------------------------------------------------
class Node:
    """One trie node: children by token (in creation order) and two float32 counts."""

    __slots__ = ("token", "children", "prompt", "output")

    def __init__(self, token: int):
        self.token = token
        self.children: dict[int, Node] = {}
        self.prompt = F32(0.0)
        self.output = F32(0.0)

    def total(self):
        return self.prompt + self.output  # float32 + float32, like the pool

    def weight(self, prompt_weight: float) -> float:
        return prompt_weight * float(self.prompt) + float(self.output)  # float64, like the kernel

    def listed_children(self) -> list:
        """Children in the order the pool's linked list holds them: newest first."""
        return list(reversed(self.children.values()))

    def size(self) -> int:
        return 1 + sum(c.size() for c in self.children.values())


class NaiveTrie:
    """The trie drafter's rules, written the long way (see trie_kernels' module docstring).

    Requests: start(prompt) → update(tokens)* / propose(context, budget)* → finish().
    propose returns (tokens, parents, depths, scores) as lists; scores are np.float32.
    """

    def __init__(self, capacity: int, branch_length: int, max_match: int = 8, prompt_weight: float = 4.0,
                 min_stage_nodes: int = 8, fill: bool = True, layout: str = "hierarchical",
                 insert_prompt: bool = True, insert_output: bool = True, eliminate_prompt: bool = True,
                 heap_capacity: int = HEAP_CAPACITY):
        assert layout in ("hierarchical", "single")
        self.capacity, self.branch_length, self.max_match = capacity, branch_length, max_match
        self.prompt_weight, self.min_stage_nodes, self.fill = float(prompt_weight), min_stage_nodes, fill
        self.single = layout == "single"
        self.insert_prompt, self.insert_output = insert_prompt, insert_output
        self.eliminate_prompt = eliminate_prompt
        self.heap_capacity = heap_capacity
        self.root = Node(-1)
        self.n_nodes = 0
        self.n_prunes = 0
        self.stream: list[int] = []
        self.n_prompt = 0
        self.active = False

    # -- requests ---------------------------------------------------------------------------------
    def start(self, prompt) -> None:
        if self.active:
            self.finish()
        self.stream = [int(t) for t in prompt]
        self.n_prompt = len(self.stream)
        self.active = True
        if self.insert_prompt:
            self._extend(self.stream, 0, len(self.stream), self.n_prompt)

    def update(self, tokens) -> None:
        assert self.active
        begin = len(self.stream)
        self.stream += [int(t) for t in tokens]
        if self.insert_output:
            # Without prompt branches, branches that start inside the prompt are not counted at all.
            first_start = 0 if self.insert_prompt else self.n_prompt
            self._extend(self.stream, begin, len(self.stream), self.n_prompt, first_start)

    def finish(self) -> None:
        if not self.active:
            return
        if self.eliminate_prompt and self.insert_prompt:
            self._eliminate(self.stream, self.n_prompt)
        self.active = False
        self.stream, self.n_prompt = [], 0

    def warm_up(self, sequences) -> None:
        for seq in sequences:
            self._extend([int(t) for t in seq], 0, len(seq), 0)

    def node_count(self) -> int:
        return self.n_nodes

    # -- counting ---------------------------------------------------------------------------------
    def find(self, path):
        """The node of a token path from the root, or None."""
        node = self.root
        for t in path:
            node = node.children.get(int(t))
            if node is None:
                return None
        return node

    def _extend(self, stream, begin, end, n_prompt, first_start=0) -> None:
        """Token p extends every branch that starts at s in (p - branch_length, p]: the node of
        stream[s..p] gains one count of the branch's kind, if its parent (stream[s..p-1]) exists and
        a node can be had. Longer branches go first (they get the last free nodes)."""
        bl = self.branch_length
        for p in range(begin, end):
            if self.capacity - self.n_nodes < bl:
                self._make_room(max(bl, self.capacity // 8))
            token = stream[p]
            for s in range(max(0, p - bl + 1), p + 1):
                if s < first_start:
                    continue
                parent = self.find(stream[s:p])
                if parent is None:
                    continue  # the branch lost a node earlier (pool full or pruned): it ends
                node = parent.children.get(token)
                if node is None:
                    if self.n_nodes >= self.capacity:
                        continue
                    node = parent.children[token] = Node(token)
                    self.n_nodes += 1
                if s < n_prompt:
                    node.prompt = F32(node.prompt + F32(1.0))
                else:
                    node.output = F32(node.output + F32(1.0))

    def _all_nodes(self):
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _make_room(self, target: int) -> None:
        """Halve every OUTPUT count and prune, until `target` nodes are free, at most 64 times;
        give up early when a pass frees nothing and no OUTPUT count is 1 or more."""
        for _ in range(64):
            if self.capacity - self.n_nodes >= target:
                return
            largest = 0.0
            for node in self._all_nodes():
                node.output = F32(node.output * F32(0.5))
                largest = max(largest, float(node.output))
            freed = self._prune()
            if freed == 0 and largest < 1.0:
                return

    def _prune(self) -> int:
        """Free every node whose total count is below 1, with everything below it."""
        freed = 0

        def sweep(node):
            nonlocal freed
            for token, child in list(node.children.items()):
                if child.total() < 1.0:
                    freed += child.size()
                    del node.children[token]
            for child in node.children.values():
                sweep(child)

        sweep(self.root)
        self.n_nodes -= freed
        self.n_prunes += 1
        return freed

    def _eliminate(self, stream, n_prompt) -> None:
        """Take one PROMPT count (not below 0) off each node of each prompt branch, then prune."""
        for s in range(n_prompt):
            node = self.root
            for q in range(s, min(s + self.branch_length, len(stream))):
                node = node.children.get(stream[q])
                if node is None:
                    break
                node.prompt = F32(max(float(node.prompt) - 1.0, 0.0))
        self._prune()

    # -- retrieval --------------------------------------------------------------------------------
    def propose(self, context, budget: int):
        """(tokens, parents, depths, scores) of the draft continuing `context`."""
        context = [int(t) for t in context]
        n = len(context)
        out = _Draft(context[-1])
        fallback = None
        for m in range(min(self.max_match, n), 0, -1):
            if len(out.tokens) > budget:
                break
            matched = self.find(context[n - m:])
            if matched is None:
                continue
            if self.fill:
                self._select(matched, out, budget)
                continue
            stage = _Draft(context[-1])
            self._select(matched, stage, budget)
            if len(stage.tokens) - 1 >= self.min_stage_nodes:
                return stage.as_tuple()
            if len(stage.tokens) > 1 and fallback is None:
                fallback = stage
        return (fallback or out).as_tuple()

    def _select(self, matched, out, budget) -> None:
        """Best-first over the sub-trie below `matched`: score = w(node) / w(matched); ties by
        (draft parent, token). A node already in the draft (same parent, same token) is reused."""
        w_matched = matched.weight(self.prompt_weight)
        if w_matched <= 0.0:
            return
        candidates = []  # (score, draft parent, token, trie node)

        def order(c):
            return (-c[0], c[1], c[2])  # best first

        def offer(node, draft_parent):
            score = F32(node.weight(self.prompt_weight) / w_matched)
            candidates.append((score, draft_parent, node.token, node))
            if len(candidates) > self.heap_capacity:  # a full list keeps its best
                candidates.remove(max(candidates, key=order))

        for child in matched.listed_children():
            offer(child, 0)
        while candidates and len(out.tokens) <= budget:
            best = min(candidates, key=order)
            candidates.remove(best)
            score, draft_parent, token, node = best
            assert all(order(c) != order(best) for c in candidates), "two candidates tie in the order"
            if score <= 0.0:
                continue
            d = out.find(draft_parent, token)
            if d is None:
                d = out.add(token, draft_parent, score)
            if self.single:
                candidates.clear()
            for child in node.listed_children():
                offer(child, d)


class _Draft:
    def __init__(self, root: int):
        self.tokens, self.parents, self.depths, self.scores = [root], [-1], [0], [F32(1.0)]

    def find(self, parent, token):
        for j in range(len(self.tokens)):
            if self.parents[j] == parent and self.tokens[j] == token:
                return j
        return None

    def add(self, token, parent, score) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.scores.append(score)
        return len(self.tokens) - 1

    def as_tuple(self):
        return self.tokens, self.parents, self.depths, self.scores


# -- whole-trie comparisons -----------------------------------------------------------------------
def naive_trie_contents(trie: NaiveTrie) -> dict:
    """{token path (tuple): (PROMPT, OUTPUT)} of every node."""
    out = {}
    stack = [((), trie.root)]
    while stack:
        path, node = stack.pop()
        for token, child in node.children.items():
            out[path + (token,)] = (float(child.prompt), float(child.output))
            stack.append((path + (token,), child))
    return out


def naive_child_order(trie: NaiveTrie) -> dict:
    """{token path: tuple of child tokens, newest first} for every node with children (root = ())."""
    out = {}
    stack = [((), trie.root)]
    while stack:
        path, node = stack.pop()
        if node.children:
            out[path] = tuple(c.token for c in node.listed_children())
        for token, child in node.children.items():
            stack.append((path + (token,), child))
    return out


def _pool_walk(state):
    """Yield (path, node, child list) over a node pool (links, freq, free, root, meta, front)."""
    from draftcore.drafters.trie_kernels import CHILD, ROOT_FIRST, SIBLING, TOKEN
    links, meta = state[0], state[4]
    capacity = links.shape[0]

    def children(first):
        kids, c = [], int(first)
        while c >= 0:
            kids.append(c)
            assert len(kids) <= capacity, "cycle in a child list"
            c = int(links[c, SIBLING])
        return kids

    stack = [((), -1, children(meta[ROOT_FIRST]))]
    while stack:
        path, node, kids = stack.pop()
        yield path, node, kids
        for c in kids:
            stack.append((path + (int(links[c, TOKEN]),), c, children(links[c, CHILD])))
            assert len(stack) <= capacity + 1, "cycle in the pool"


def pool_contents(state) -> dict:
    """{token path: (PROMPT, OUTPUT)} read from a pool's arrays (drafter._state)."""
    freq = state[1]
    return {path: (float(freq[node, 0]), float(freq[node, 1]))
            for path, node, _ in _pool_walk(state) if node >= 0}


def pool_child_order(state) -> dict:
    links = state[0]
    return {path: tuple(int(links[c, 0]) for c in kids) for path, _, kids in _pool_walk(state) if kids}


def naive_branch_counts(requests, branch_length: int, insert_prompt: bool = True) -> dict:
    """{path: (PROMPT, OUTPUT)} from the definition, for (prompt, output) requests, none running,
    no pruning: OUTPUT = number of branches that start in an output and pass through the path."""
    counts = {}
    for prompt, output in requests:
        stream = list(prompt) + list(output)
        for s in range(len(prompt), len(stream)):
            for e in range(s + 1, min(s + branch_length, len(stream)) + 1):
                key = tuple(stream[s:e])
                counts[key] = counts.get(key, 0) + 1
    return {k: (0.0, float(v)) for k, v in counts.items()}


# -- acceptance -----------------------------------------------------------------------------------
def naive_greedy_accept(tokens, parents, model_tokens):
    """(path of node indices root first, next token): follow the first child holding the model's
    token until there is none."""
    path = [0]
    while True:
        u = path[-1]
        kids = [v for v in range(len(tokens)) if parents[v] == u and tokens[v] == model_tokens[u]]
        if not kids:
            return path, int(model_tokens[u])
        path.append(kids[0])
