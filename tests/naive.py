"""Slow, obviously-correct pure-Python twins of draftcore's jitted code (stumpy's tests/naive.py).

Tests run the real thing and the twin on the same inputs and require the same answer. The twins
use dicts and lists, walk from the root instead of keeping a `front`, search linearly instead of
keeping heaps and child lists, and share nothing with draftcore but the documented constants.

    NaiveTrie            the trie drafter's counting / pruning / elimination / retrieval rules
    naive_trie_contents  {token path: (PROMPT, OUTPUT, RECENT)} of a NaiveTrie
    pool_contents        the same mapping read from a TrieDrafter's node-pool arrays
    naive_child_order    {token path: child tokens in the order of the pool's child lists}
    pool_child_order     the same read from the pool
    naive_branch_counts  OUTPUT counts straight from the definition (no capacity pressure)
    naive_greedy_accept  greedy acceptance of one verified tree
"""
from __future__ import annotations

import numpy as np

F32 = np.float32
HEAP_CAPACITY = 1 << 12  # draftcore.drafters.trie_kernels.CANDIDATES: most candidates kept at once
TOP_K = 64              # draftcore.drafters.trie_kernels.TOP_K: stage-0 candidates


# -- the trie ---------------------------------------------------------------------------------------
class Node:
    """One trie node: children by token (in creation order) and three float32 counts."""

    __slots__ = ("token", "children", "prompt", "output", "recent")

    def __init__(self, token: int):
        self.token = token
        self.children: dict[int, Node] = {}
        self.prompt = F32(0.0)
        self.output = F32(0.0)
        self.recent = F32(0.0)

    def total(self):
        return self.prompt + self.output  # float32 + float32, like the pool; RECENT does not count

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

    def __init__(self, capacity: int, branch_length: int, max_match: int = 8, prompt_weight: float = 16.0,
                 recent_weight: float = 16.0, min_stage_nodes: int = 8, fill: bool = True, use_top: bool = True,
                 layout: str = "hierarchical", insert_prompt: bool = True, insert_output: bool = True,
                 eliminate_prompt: bool = True, heap_capacity: int = HEAP_CAPACITY):
        assert layout in ("hierarchical", "single")
        self.capacity, self.branch_length, self.max_match = capacity, branch_length, max_match
        self.prompt_weight, self.recent_weight = float(prompt_weight), float(recent_weight)
        self.min_stage_nodes, self.fill, self.use_top = min_stage_nodes, fill, use_top
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
        self._end_request(self.stream, self.n_prompt if self.insert_prompt else 0,
                          keep_prompt=not self.eliminate_prompt)
        self.active = False
        self.stream, self.n_prompt = [], 0

    def warm_up(self, sequences) -> None:
        """Each sequence: a finished request that was all output."""
        for seq in sequences:
            seq = [int(t) for t in seq]
            self._extend(seq, 0, len(seq), 0)
            self._end_request(seq, 0, keep_prompt=False)

    def node_count(self) -> int:
        return self.n_nodes

    def weight(self, node) -> float:
        """w = prompt_weight * PROMPT + recent_weight * RECENT + OUTPUT, in float64 like the kernel."""
        return self.prompt_weight * float(node.prompt) + self.recent_weight * float(node.recent) + float(node.output)

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
        stream[s..p] gains one count of the branch's kind (PROMPT if s is in the prompt, else OUTPUT
        and RECENT), if its parent (stream[s..p-1]) exists and a node can be had. Longer branches go
        first (they get the last free nodes)."""
        bl = self.branch_length
        one = F32(1.0)
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
                    node.prompt = F32(node.prompt + one)
                else:
                    node.output = F32(node.output + one)
                    node.recent = F32(node.recent + one)

    def _all_nodes(self):
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _make_room(self, target: int) -> None:
        """Halve every OUTPUT and RECENT count and prune, until `target` nodes are free, at most 64
        times; give up early when a pass frees nothing and no OUTPUT count is 1 or more."""
        half = F32(0.5)
        for _ in range(64):
            if self.capacity - self.n_nodes >= target:
                return
            largest = 0.0
            for node in self._all_nodes():
                node.output = F32(node.output * half)
                node.recent = F32(node.recent * half)
                largest = max(largest, float(node.output))
            freed = self._prune()
            if freed == 0 and largest < 1.0:
                return

    def _prune(self) -> int:
        """Free every node whose PROMPT + OUTPUT is below 1, with everything below it."""
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

    def _end_request(self, stream, n_prompt, keep_prompt) -> None:
        """Walk every branch of the request: a prompt branch gives back one PROMPT count per node
        (not below 0; with keep_prompt it becomes an OUTPUT count), every branch zeroes RECENT; a
        walk stops at a node whose PROMPT + OUTPUT fell below 1. Then, for each parent of such a
        node that is still in the trie, every child below 1 is freed with everything below it
        (a local prune: nothing else in the trie is looked at)."""
        touched = []  # token paths of the parents
        for s in range(len(stream)):
            node = self.root
            for q in range(s, min(s + self.branch_length, len(stream))):
                node = node.children.get(stream[q])
                if node is None:
                    break
                if s < n_prompt:
                    node.prompt = F32(max(float(node.prompt) - 1.0, 0.0))
                    if keep_prompt:
                        node.output = F32(node.output + F32(1.0))
                node.recent = F32(0.0)
                if node.total() < 1.0:
                    touched.append(stream[s:q])
                    break
        for path in touched:
            parent = self.find(path)
            if parent is None:
                continue  # freed with an ancestor
            for token, child in list(parent.children.items()):
                if child.total() < 1.0:
                    self.n_nodes -= child.size()
                    del parent.children[token]
        self.n_prunes += 1

    # -- retrieval --------------------------------------------------------------------------------
    def propose(self, context, budget: int):
        """(tokens, parents, depths, scores) of the draft continuing `context`: stages from the
        longest matched suffix down to 1 (then 0, the root's heaviest children, with use_top)."""
        context = [int(t) for t in context]
        n = len(context)
        out = _Draft(context[-1])
        fallback = None
        for m in range(min(self.max_match, n), -1 if self.use_top else 0, -1):
            if len(out.tokens) > budget:
                break
            matched = self.root if m == 0 else self.find(context[n - m:])
            if matched is None:
                continue
            if self.fill:
                self._stage(matched, out, budget)
            else:
                stage = _Draft(context[-1])
                self._stage(matched, stage, budget)
                if len(stage.tokens) - 1 >= self.min_stage_nodes:
                    return stage.as_tuple()
                if len(stage.tokens) > 1 and fallback is None:
                    fallback = stage
            if self.single and len(out.tokens) > 1:
                break  # one branch, from one stage
        return (fallback or out).as_tuple()

    def _stage(self, matched, out, budget) -> None:
        """Best-first over the sub-trie below `matched`: a child of the matched node scores
        w(child) / w(matched), a deeper node its parent's score times w(node) / w(parent); ties by
        (draft parent, token). Stage 0 (matched is the root): the TOP_K heaviest root children,
        each scored w / (total weight of the root's children), not expanded further. A node
        already in the draft (same draft parent, same token) is reused."""
        candidates = []  # (score, draft parent, token, trie node)

        def order(c):
            return (-c[0], c[1], c[2])  # best first

        def offer(score, node, draft_parent):
            candidates.append((score, draft_parent, node.token, node))
            if len(candidates) > self.heap_capacity:  # a full list keeps its best
                candidates.remove(max(candidates, key=order))

        if matched is self.root:
            kids = list(self.root.children.values())
            total = F32(sum(self.weight(c) for c in kids))
            kids.sort(key=lambda c: (-self.weight(c), c.token))
            for child in kids[:TOP_K]:
                if total > 0.0:
                    offer(F32(F32(self.weight(child)) / total), child, 0)
        else:
            w_matched = self.weight(matched)
            if w_matched <= 0.0:
                return
            for child in matched.listed_children():
                offer(F32(self.weight(child) / w_matched), child, 0)

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
            w_node = self.weight(node)
            if w_node <= 0.0 or matched is self.root:
                continue
            for child in node.listed_children():
                offer(F32(float(score) * (self.weight(child) / w_node)), child, d)


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
    """{token path (tuple): (PROMPT, OUTPUT, RECENT)} of every node."""
    out = {}
    stack = [((), trie.root)]
    while stack:
        path, node = stack.pop()
        for token, child in node.children.items():
            out[path + (token,)] = (float(child.prompt), float(child.output), float(child.recent))
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
    """Yield (path, node, child list) over a node pool (drafter._state, a trie_kernels.TrieState),
    root first (node -1, path ())."""
    from draftcore.drafters.trie_kernels import CHILD, ROOT_FIRST, SIBLING, TOKEN
    links, meta = state.links, state.meta
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
    """{token path: (PROMPT, OUTPUT, RECENT)} read from a pool's arrays (drafter._state)."""
    from draftcore.drafters.trie_kernels import OUTPUT, PROMPT, RECENT
    freq = state.freq
    return {path: (float(freq[node, PROMPT]), float(freq[node, OUTPUT]), float(freq[node, RECENT]))
            for path, node, _ in _pool_walk(state) if node >= 0}


def pool_child_order(state) -> dict:
    from draftcore.drafters.trie_kernels import TOKEN
    links = state.links
    return {path: tuple(int(links[c, TOKEN]) for c in kids) for path, _, kids in _pool_walk(state) if kids}


def naive_branch_counts(requests, branch_length: int) -> dict:
    """{path: (PROMPT, OUTPUT, RECENT)} from the definition after (prompt, output) requests, none
    running, nothing pruned: OUTPUT = the number of branches that start in an output and pass
    through the path; prompt branches are gone and RECENT is zero."""
    counts = {}
    for prompt, output in requests:
        stream = list(prompt) + list(output)
        for s in range(len(prompt), len(stream)):
            for e in range(s + 1, min(s + branch_length, len(stream)) + 1):
                key = tuple(stream[s:e])
                counts[key] = counts.get(key, 0) + 1
    return {k: (0.0, float(v), 0.0) for k, v in counts.items()}


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
