"""Slow, obviously-correct pure-Python twins of draftcore's jitted code (stumpy's tests/naive.py).

Tests run the real thing and the twin on the same inputs and require the same answer. The twins
use dicts and lists, walk from the root instead of keeping a `front`, search linearly instead of
keeping heaps and child lists, and share nothing with draftcore but the documented constants.

    NaiveTrie            the trie drafter's counting / pruning / elimination / retrieval rules, and
                         a request's learning of the model's tokens (NaiveRequest.observe)
    naive_trie_contents  {token path: (PROMPT, OUTPUT, RECENT)} of a NaiveTrie
    pool_contents        the same mapping read from a TrieDrafter's node-pool arrays
    naive_child_order    {token path: child tokens in the order of the pool's child lists}
    pool_child_order     the same read from the pool
    naive_branch_counts  OUTPUT counts straight from the definition (no capacity pressure)
    naive_greedy_accept  greedy acceptance of one verified tree
    NaiveRowDrafter      RowDrafter's row bookkeeping and cost rule, with known request identities
    naive_would_accept   what each node of a proposal would have done, from the emitted tokens
    naive_expected_accepted  the auto budget's tree-consistent expected accepted tokens per prefix
"""
from __future__ import annotations

import math

import numpy as np

F32 = np.float32
HEAP_CAPACITY = 1 << 12  # draftcore.drafters.trie_kernels.CANDIDATES: most candidates kept at once
TOP_K = 64              # draftcore.drafters.trie_kernels.TOP_K: stage-0 candidates
CAL_EDGES = (0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.9, 0.999)  # trie_kernels.CAL_EDGES: relative-weight bins
CAL_ROWS = 13           # trie_kernels.CAL_ROWS: context lengths 0 .. 12
CAL_CAP = 1024.0        # trie_kernels.CAL_CAP: a cell's counts halve on reaching this
CAL_PRIOR = 2.0         # trie_kernels.CAL_PRIOR: prior candidates per cell, at the bin's centre
PENDING = 16            # trie.py's _PENDING: drafts a request remembers for the calibration


# -- the trie ---------------------------------------------------------------------------------------
class Node:
    """One trie node: children by token (in creation order), three float32 counts (PROMPT and
    RECENT: the sums over requests in progress) and each request's own [PROMPT, RECENT]."""

    __slots__ = ("token", "children", "prompt", "output", "recent", "own")

    def __init__(self, token: int):
        self.token = token
        self.children: dict[int, Node] = {}
        self.prompt = F32(0.0)
        self.output = F32(0.0)
        self.recent = F32(0.0)
        self.own: dict[int, list] = {}  # request id -> [PROMPT, RECENT] of that request

    def own_counts(self, request) -> list:
        return self.own.setdefault(request.id, [F32(0.0), F32(0.0)])

    def total(self):
        return self.prompt + self.output  # float32 + float32, like the pool; RECENT does not count

    def listed_children(self) -> list:
        """Children in the order the pool's linked list holds them: newest first."""
        return list(reversed(self.children.values()))

    def size(self) -> int:
        return 1 + sum(c.size() for c in self.children.values())


class NaiveRequest:
    """One request in progress on a NaiveTrie (NaiveTrie.open): update, propose, finish."""

    def __init__(self, trie: "NaiveTrie", prompt, request_id: int):
        self.trie, self.id = trie, request_id
        self.stream = [int(t) for t in prompt]
        self.n_prompt = self.n_counted = len(self.stream)
        self.ended = False
        self.proposals = []  # (stream length, (tokens, parents, depths, cells)) not learnt from yet
        self.learnt = []     # snippets (prefix tail + the model's token) counted as this request's own, oldest first
        self.context = None  # the context of the last propose, until its tree is observed

    def update(self, tokens) -> None:
        """Append tokens; like TrieRequest, they are counted at the next propose or at finish."""
        assert not self.ended
        self.stream += [int(t) for t in tokens]

    def count(self) -> None:
        trie = self.trie
        begin, self.n_counted = self.n_counted, len(self.stream)
        if trie.insert_output and begin < len(self.stream):
            # Without prompt branches, branches that start inside the prompt are not counted at all.
            first_start = 0 if trie.insert_prompt else self.n_prompt
            trie._extend(self, self.stream, begin, len(self.stream), self.n_prompt, first_start)

    def propose(self, context, budget: int):
        assert not self.ended
        self.count()
        self.trie._learn(self, final=False)
        draft = self.trie._draft(self, context, budget)
        if self.trie.calibrated and len(context) == len(self.stream):
            self.proposals.append((len(self.stream), (draft.tokens, draft.parents, draft.depths, draft.cells)))
        self.context = [int(t) for t in context]
        return draft.as_tuple()

    def observe(self, tokens, parents, n_candidates, node_tokens, path) -> None:
        """The model's token at each candidate off `path` (node_tokens[i] >= 0) continues that
        candidate's prefix: count it as this request's own (NaiveTrie._learn_model)."""
        assert not self.ended
        if not self.trie.learn_from_model or self.context is None:
            return
        context, self.context = self.context, None
        touched = []
        for i in range(1, n_candidates):
            if i in path or not 0 <= node_tokens[i] < self.trie.token_limit:
                continue
            prefix, node = [], i
            while node > 0:
                prefix.append(int(tokens[node]))
                node = parents[node]
            prefix = context + prefix[::-1]
            self.trie._learn_model(self, prefix[-self.trie.learn_context:] + [int(node_tokens[i])], touched)
        self.trie._sweep_touched(touched)

    def finish(self) -> None:
        if self.ended:
            return
        self.count()
        trie = self.trie
        trie._learn(self, final=True)
        touched = []
        for snippet in self.learnt:
            trie._uncount_model(self, snippet, touched)
        trie._sweep_touched(touched)
        self.learnt = []
        trie._end_request(self, self.stream, self.n_prompt if trie.insert_prompt else 0,
                          keep_prompt=not trie.eliminate_prompt)
        self.ended = True
        trie.live.remove(self)


class _NoRequest:
    id = -1


_NO_REQUEST = _NoRequest()


class NaiveTrie:
    """The trie drafter's rules, written the long way (see trie_kernels' module docstring).

    Requests, any number at once: open(prompt) -> a NaiveRequest (update / propose / finish).
    The one-request-at-a-time calls start(prompt) → update(tokens)* / propose(context, budget)* →
    finish() drive one request of their own. propose returns (tokens, parents, depths, scores) as
    lists; scores are np.float32.
    """

    def __init__(self, capacity: int, branch_length: int, max_match: int = 8, prompt_weight: float = 16.0,
                 recent_weight: float = 16.0, min_stage_nodes: int = 8, fill: bool = True, use_top: bool = True,
                 layout: str = "hierarchical", insert_prompt: bool = True, insert_output: bool = True,
                 eliminate_prompt: bool = True, heap_capacity: int = HEAP_CAPACITY, calibrate: bool = True,
                 learn_from_model: bool = True, learn_context: int = 4, learn_capacity: int = 1024,
                 token_limit: int = 1 << 18):
        assert layout in ("hierarchical", "single")
        self.capacity, self.branch_length, self.max_match = capacity, branch_length, max_match
        self.prompt_weight, self.recent_weight = float(prompt_weight), float(recent_weight)
        self.min_stage_nodes, self.fill, self.use_top = min_stage_nodes, fill, use_top
        self.single = layout == "single"
        self.insert_prompt, self.insert_output = insert_prompt, insert_output
        self.eliminate_prompt = eliminate_prompt
        self.heap_capacity = heap_capacity
        self.learn_from_model, self.learn_context = learn_from_model, learn_context
        self.learn_capacity, self.token_limit = learn_capacity, token_limit
        self.calibrated = calibrate and fill and not self.single
        edges = (0.0,) + CAL_EDGES + (1.0,)
        # {(context length, bin): [candidates whose parent path came true, of them came true too]}
        self.cal = {(m, b): [CAL_PRIOR, CAL_PRIOR * (edges[b] + edges[b + 1]) / 2]
                    for m in range(CAL_ROWS) for b in range(len(CAL_EDGES) + 1)}
        self.root = Node(-1)
        self.n_nodes = 0
        self.n_prunes = 0
        self.live: list[NaiveRequest] = []
        self.n_opened = 0
        self.current: NaiveRequest | None = None

    # -- requests ---------------------------------------------------------------------------------
    def open(self, prompt) -> NaiveRequest:
        request = NaiveRequest(self, prompt, self.n_opened)
        self.n_opened += 1
        self.live.append(request)
        if self.insert_prompt:
            self._extend(request, request.stream, 0, len(request.stream), request.n_prompt)
        return request

    def start(self, prompt) -> None:
        if self.current is not None:
            self.current.finish()
        self.current = self.open(prompt)

    def update(self, tokens) -> None:
        self.current.update(tokens)

    def propose(self, context, budget: int):
        """The current request's draft, or, with none, a one-off draft that no request's own counts
        weigh in (TrieDrafter.propose)."""
        if self.current is None:
            return self._propose(_NO_REQUEST, context, budget)
        return self.current.propose(context, budget)

    def finish(self) -> None:
        if self.current is not None:
            self.current.finish()
        self.current = None

    def warm_up(self, sequences) -> None:
        """Each sequence: a finished request that was all output (whatever insert_output says)."""
        for seq in sequences:
            request = self.open([])
            seq = [int(t) for t in seq]
            request.stream = seq
            request.n_counted = len(seq)
            self._extend(request, seq, 0, len(seq), 0)
            request.finish()

    def node_count(self) -> int:
        return self.n_nodes

    def weight(self, node, request=None) -> float:
        """w = prompt_weight * PROMPT + recent_weight * RECENT + OUTPUT, in float64 like the kernel:
        PROMPT and RECENT the request's own, or (request None: stage 0) the sums over requests."""
        if request is None:
            prompt, recent = node.prompt, node.recent
        else:
            prompt, recent = node.own.get(request.id, (F32(0.0), F32(0.0)))
        return self.prompt_weight * float(prompt) + self.recent_weight * float(recent) + float(node.output)

    # -- counting ---------------------------------------------------------------------------------
    def find(self, path):
        """The node of a token path from the root, or None."""
        node = self.root
        for t in path:
            node = node.children.get(int(t))
            if node is None:
                return None
        return node

    def _extend(self, request, stream, begin, end, n_prompt, first_start=0) -> None:
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
                    continue  # no node for the branch so far (pool full, or pruned): nothing to extend
                node = self._child_or_new(parent, token)
                if node is None:
                    continue
                own = node.own_counts(request)
                if s < n_prompt:
                    node.prompt = F32(node.prompt + one)
                    own[0] = F32(own[0] + one)
                else:
                    node.output = F32(node.output + one)
                    node.recent = F32(node.recent + one)
                    own[1] = F32(own[1] + one)

    def _child_or_new(self, parent, token):
        """parent's child holding `token`, created if missing and the pool has room; else None."""
        node = parent.children.get(token)
        if node is None and self.n_nodes < self.capacity:
            node = parent.children[token] = Node(token)
            self.n_nodes += 1
        return node

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
                for own in node.own.values():
                    own[1] = F32(own[1] * half)
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

    def _end_request(self, request, stream, n_prompt, keep_prompt) -> None:
        """Walk every branch of the request: a prompt branch gives back one of the request's own
        PROMPT counts per node (not below 0; with keep_prompt it becomes an OUTPUT count), every
        branch gives back the request's own RECENT; the sums lose what the request gave back. A
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
                own = node.own.get(request.id)
                if own is not None:
                    if s < n_prompt:
                        before = own[0]
                        after = F32(max(float(before) - 1.0, 0.0))
                        own[0] = after
                        node.prompt = F32(max(float(node.prompt) - float(F32(before - after)), 0.0))
                    if own[1] != 0.0:
                        node.recent = F32(max(float(node.recent) - float(own[1]), 0.0))
                        own[1] = F32(0.0)
                    if own[0] == 0.0 and own[1] == 0.0:
                        del node.own[request.id]
                if s < n_prompt and keep_prompt:
                    node.output = F32(node.output + F32(1.0))
                if node.total() < 1.0:
                    touched.append(stream[s:q])
                    break
        self._free_below_one(touched)
        self.n_prunes += 1

    # -- the model's tokens, learnt for one request -------------------------------------------------
    def _learn_model(self, request, snippet, touched) -> None:
        """Count one snippet (prefix tail, then the model's token t): after each suffix of the tail
        whose node exists, t's node (created where missing and a node is free) gains one own PROMPT
        count; the suffix node gains nothing. A full ring forgets its oldest first; when fewer than
        learn_context nodes are free, room is made first (which frees every node below 1: what
        `touched` holds so far is done with)."""
        if len(request.learnt) == self.learn_capacity:
            self._uncount_model(request, request.learnt.pop(0), touched)
        if self.capacity - self.n_nodes < self.learn_context:
            self._make_room(max(self.learn_context, self.capacity // 8))
            touched.clear()
        one, token = F32(1.0), snippet[-1]
        for s in range(len(snippet) - 1):
            parent = self.find(snippet[s:-1])
            if parent is None:
                continue
            node = self._child_or_new(parent, token)
            if node is None:
                continue
            own = node.own_counts(request)
            node.prompt = F32(node.prompt + one)
            own[0] = F32(own[0] + one)
        request.learnt.append(list(snippet))

    def _uncount_model(self, request, snippet, touched) -> None:
        """Take one own PROMPT count (not below 0) from t's node after each suffix, where both
        still stand; the suffix of a node that fell below 1 goes to `touched`."""
        token = snippet[-1]
        for s in range(len(snippet) - 1):
            parent = self.find(snippet[s:-1])
            node = None if parent is None else parent.children.get(token)
            if node is None:
                continue
            own = node.own.get(request.id)
            if own is not None:
                before = own[0]
                own[0] = after = F32(max(float(before) - 1.0, 0.0))
                node.prompt = F32(max(float(node.prompt) - float(F32(before - after)), 0.0))
                if own[0] == 0.0 and own[1] == 0.0:
                    del node.own[request.id]
            if node.total() < 1.0:
                touched.append(snippet[s:-1])

    def _sweep_touched(self, touched) -> None:
        """Free the children below 1 of each touched path (one prune pass, when there is any)."""
        if touched:
            self._free_below_one(touched)
            self.n_prunes += 1

    def _free_below_one(self, paths) -> None:
        """For each path still in the trie, free its children below 1 with everything below them."""
        for path in paths:
            parent = self.find(path)
            if parent is None:
                continue  # freed with an ancestor
            for token, child in list(parent.children.items()):
                if child.total() < 1.0:
                    self.n_nodes -= child.size()
                    del parent.children[token]

    # -- retrieval --------------------------------------------------------------------------------
    def _propose(self, request, context, budget: int):
        """(tokens, parents, depths, scores) of the draft continuing `context` for `request`."""
        return self._draft(request, context, budget).as_tuple()

    def _draft(self, request, context, budget: int) -> "_Draft":
        """The draft continuing `context` for `request`: stages from the longest matched suffix down
        to 1 (then 0, the root's heaviest children, with use_top), one after another, or all at once
        when calibrated."""
        context = [int(t) for t in context]
        if self.calibrated:
            return self._all_stages(request, context, budget)
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
                self._stage(request, matched, out, budget)
            else:
                stage = _Draft(context[-1])
                self._stage(request, matched, stage, budget)
                if len(stage.tokens) - 1 >= self.min_stage_nodes:
                    return stage
                if len(stage.tokens) > 1 and fallback is None:
                    fallback = stage
            if self.single and len(out.tokens) > 1:
                break  # one branch, from one stage
        return fallback or out

    # -- calibrated retrieval ---------------------------------------------------------------------
    def _cell(self, m_eff: int, ratio) -> tuple:
        ratio = float(ratio)  # compared in float64, as the kernel does (a float32 0.02 is below 0.02)
        return min(m_eff, CAL_ROWS - 1), sum(1 for edge in CAL_EDGES if ratio >= edge)

    def _calibrated(self, score, m_eff: int, ratio):
        """(score, cell): the parent's score times the cell's rate; 0 for a node of no weight."""
        cell = self._cell(m_eff, ratio)
        if ratio <= 0.0:
            return F32(0.0), cell
        offered, hits = self.cal[cell]
        return F32(float(score) * (hits / offered)), cell

    def _all_stages(self, request, context, budget: int) -> "_Draft":
        """Every stage's first candidates in one list, scored by their cells' rates; best first,
        ties by (draft parent, token, longer context); a taken node's children follow (not those
        of stage 0)."""
        n = len(context)
        out = _Draft(context[-1])
        candidates = []  # (score, draft parent, token, cell, trie node)

        def order(c):
            return (-c[0], c[1], c[2], -c[3][0], -c[3][1])

        def offer(scored, node, draft_parent):
            candidates.append((scored[0], draft_parent, node.token, scored[1], node))
            if len(candidates) > self.heap_capacity:
                candidates.remove(max(candidates, key=order))

        for m in range(min(self.max_match, n), -1 if self.use_top else 0, -1):
            if m == 0:
                kids = list(self.root.children.values())
                total = F32(sum(self.weight(c) for c in kids))
                kids.sort(key=lambda c: (-self.weight(c), c.token))
                for child in kids[:TOP_K]:
                    if total > 0.0:
                        offer(self._calibrated(F32(1.0), 0, F32(F32(self.weight(child)) / total)), child, 0)
                continue
            matched = self.find(context[n - m:])
            if matched is None:
                continue
            w_matched = self.weight(matched, request)
            if w_matched <= 0.0:
                continue
            for child in matched.listed_children():
                offer(self._calibrated(F32(1.0), m, self.weight(child, request) / w_matched), child, 0)

        while candidates and len(out.tokens) <= budget:
            best = min(candidates, key=order)
            candidates.remove(best)
            score, draft_parent, token, cell, node = best
            if score <= 0.0:
                continue
            d = out.find(draft_parent, token)
            if d is None:
                d = out.add(token, draft_parent, score, cell)
            w_node = self.weight(node, request)
            if w_node <= 0.0 or cell[0] == 0:
                continue
            for child in node.listed_children():
                offer(self._calibrated(score, cell[0] + 1, self.weight(child, request) / w_node), child, d)
        return out

    def _learn(self, request, final: bool) -> None:
        """What became of the request's remembered drafts, once the stream settles them (all when
        final; the oldest as it stands while more than PENDING wait): a node whose parent's path
        came true counts in its cell, and as a hit when its own token came true too."""
        stream = request.stream
        while request.proposals:
            pos, (tokens, parents, depths, cells) = request.proposals[0]
            known = len(stream) - pos
            if not (final or len(request.proposals) > PENDING) and any(d > known for d in depths[1:]):
                return
            request.proposals.pop(0)
            came_true = [True] + [False] * (len(tokens) - 1)
            for i in range(1, len(tokens)):
                if not came_true[parents[i]] or depths[i] > known:
                    continue
                hit = stream[pos + depths[i] - 1] == tokens[i]
                counts = self.cal[cells[i]]
                counts[0] += 1.0
                counts[1] += 1.0 if hit else 0.0
                if counts[0] >= CAL_CAP:
                    counts[0] *= 0.5
                    counts[1] *= 0.5
                came_true[i] = hit

    def _stage(self, request, matched, out, budget) -> None:
        """Best-first over the sub-trie below `matched`: a child of the matched node scores
        w(child) / w(matched), a deeper node its parent's score times w(node) / w(parent); ties by
        (draft parent, token), w the request's own weight. Stage 0 (matched is the root): the TOP_K
        heaviest root children by the weight over all requests, each scored w / (total weight of
        the root's children), not expanded further. A node
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
            w_matched = self.weight(matched, request)
            if w_matched <= 0.0:
                return
            for child in matched.listed_children():
                offer(F32(self.weight(child, request) / w_matched), child, 0)

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
            w_node = self.weight(node, request)
            if w_node <= 0.0 or matched is self.root:
                continue
            for child in node.listed_children():
                offer(F32(float(score) * (self.weight(child, request) / w_node)), child, d)


class _Draft:
    def __init__(self, root: int):
        self.tokens, self.parents, self.depths, self.scores = [root], [-1], [0], [F32(1.0)]
        self.cells = [None]  # calibration cells (None: uncalibrated)

    def find(self, parent, token):
        for j in range(len(self.tokens)):
            if self.parents[j] == parent and self.tokens[j] == token:
                return j
        return None

    def add(self, token, parent, score, cell=None) -> int:
        self.cells.append(cell)
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


def naive_own_contents(trie: NaiveTrie, request) -> dict:
    """{token path: (own PROMPT, own RECENT)} of one request, nodes where either is not zero."""
    out = {}
    stack = [((), trie.root)]
    while stack:
        path, node = stack.pop()
        for token, child in node.children.items():
            own = child.own.get(request.id)
            if own is not None and (own[0] != 0.0 or own[1] != 0.0):
                out[path + (token,)] = (float(own[0]), float(own[1]))
            stack.append((path + (token,), child))
    return out


def pool_own_contents(state, slot: int) -> dict:
    """The same read from a pool's `own` arrays (the request's slot)."""
    from draftcore.drafters.trie_kernels import own_counts
    own = own_counts(state, slot)
    return {path: (float(own[node, 0]), float(own[node, 1])) for path, node, _ in _pool_walk(state)
            if node >= 0 and (own[node, 0] != 0.0 or own[node, 1] != 0.0)}


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


# -- the n-gram drafters (draftcore.drafters.ngram_kernels) ----------------------------------------------
# Twins of the n-gram tables, the Jacobi window step and its n-gram pool, and the merge of draft trees,
# written from ngram_kernels' module docstring with dicts and lists: no arrays, no "front" buffers.
#
#   NaiveNGramTables     the set-associative n-gram tables: insert / ingest / longest, contents()
#   ngram_tables_rows    the same rows read from the kernels' `Tables` arrays
#   naive_ngram_draft    ngram_kernels.draft: best-first over the tables' continuations
#   NaivePool            the Jacobi n-gram pool: insert / lookup, contents()
#   jacobi_pool_contents the same read from the kernels' `Pool` arrays
#   naive_window_step    ngram_kernels.window_step: harvest, then the time and position shift
#   naive_merge_trees    ngram_kernels.merge (draftcore.drafters.merge.merge_trees)

NGRAM_WAYS = 4  # ngram_kernels.WAYS: rows per set
_FNV_OFFSET = 14695981039346656037
_FNV_PRIME = 1099511628211
_U64 = (1 << 64) - 1


def fnv1a(tokens) -> int:
    """FNV-1a 64-bit over the tokens' uint32 values, token by token (order-aware)."""
    h = _FNV_OFFSET
    for t in tokens:
        h = ((h ^ (int(t) & 0xFFFFFFFF)) * _FNV_PRIME) & _U64
    return h


def hash_bucket(tokens, n_buckets: int) -> int:
    """The set (or pool row) of a key: the hash with its high bits folded in, masked (n_buckets is a
    power of two)."""
    h = fnv1a(tokens)
    return (h ^ (h >> 29)) & (n_buckets - 1)


class _NGramRow:
    __slots__ = ("key", "nexts", "stamp")

    def __init__(self, key: tuple):
        self.key = key
        self.nexts: list = []  # [token, count], best first
        self.stamp = 0


class NaiveNGramTables:
    """ANPD's multi-level n-gram tables, the long way: level i (n = i + 2) holds keys of i + 1
    tokens in sets of NGRAM_WAYS rows; `sets[level][s][way]` is a row or None (empty)."""

    def __init__(self, levels: int, rows: int, choices: int):
        assert rows % NGRAM_WAYS == 0
        self.levels, self.rows, self.choices = levels, rows, choices
        self.n_sets = rows // NGRAM_WAYS
        self.sets = [[[None] * NGRAM_WAYS for _ in range(self.n_sets)] for _ in range(levels)]
        self.clock = 0  # one clock for every level, ticked by every insert

    def _find(self, level: int, key: tuple):
        ways = self.sets[level][hash_bucket(key, self.n_sets)]
        for row in ways:
            if row is not None and row.key == key:
                return row
        return None

    def insert(self, level: int, key, next_token: int) -> None:
        """Count `next_token` after `key` (level + 1 tokens) at `level`."""
        key = tuple(int(t) for t in key)
        assert len(key) == level + 1
        next_token = int(next_token)
        self.clock += 1
        row = self._find(level, key)
        if row is None:
            ways = self.sets[level][hash_bucket(key, self.n_sets)]
            empty = [w for w in range(NGRAM_WAYS) if ways[w] is None]
            if empty:
                way = empty[0]
            else:  # the least recently touched row is evicted
                way = min(range(NGRAM_WAYS), key=lambda w: ways[w].stamp)
            row = ways[way] = _NGramRow(key)
        row.stamp = self.clock
        known = [t for t, _ in row.nexts]
        if next_token in known:
            i = known.index(next_token)
        elif len(row.nexts) < self.choices:
            row.nexts.append([next_token, 0])
            i = len(row.nexts) - 1
        else:  # a full row: the new token replaces the last one
            row.nexts[-1] = [next_token, 0]
            i = self.choices - 1
        row.nexts[i][1] += 1
        while i > 0 and row.nexts[i][1] > row.nexts[i - 1][1]:  # overtakes its left neighbour
            row.nexts[i - 1], row.nexts[i] = row.nexts[i], row.nexts[i - 1]
            i -= 1

    def ingest(self, tokens, begin: int, end: int) -> None:
        """Every n-gram (every level) that ends at positions begin .. end - 1."""
        tokens = [int(t) for t in tokens]
        for p in range(begin, end):
            for level in range(self.levels):
                if p - level - 1 < 0:
                    break
                self.insert(level, tokens[p - level - 1:p], tokens[p])

    def longest(self, tail):
        """(level, row) of the longest key that ends `tail` (real tokens, oldest first), or None."""
        tail = [int(t) for t in tail]
        for level in range(min(self.levels, len(tail)) - 1, -1, -1):
            row = self._find(level, tuple(tail[len(tail) - level - 1:]))
            if row is not None:
                return level, row
        return None

    def contents(self) -> dict:
        """{(level, key): [(next, count), ...] best first}."""
        return {(level, row.key): [tuple(x) for x in row.nexts]
                for level in range(self.levels) for ways in self.sets[level] for row in ways if row is not None}

    def rows_by_index(self) -> dict:
        """{(level, row index = set * NGRAM_WAYS + way): (key, [(next, count), ...], stamp)}: where
        each key lives, to compare placement and eviction too."""
        out = {}
        for level in range(self.levels):
            for s, ways in enumerate(self.sets[level]):
                for w, row in enumerate(ways):
                    if row is not None:
                        out[(level, s * NGRAM_WAYS + w)] = (row.key, [tuple(x) for x in row.nexts], row.stamp)
        return out


def ngram_tables_rows(tables) -> dict:
    """NaiveNGramTables.rows_by_index read from the kernels' `Tables` arrays."""
    out = {}
    levels, rows = tables.stamps.shape
    for level in range(levels):
        for r in range(rows):
            if tables.stamps[level, r] == 0:
                continue
            key = tuple(int(t) for t in tables.keys[level, r, :level + 1])
            nexts = []
            for c in range(tables.nexts.shape[2]):
                if tables.nexts[level, r, c] < 0:
                    break
                nexts.append((int(tables.nexts[level, r, c]), int(tables.counts[level, r, c])))
            out[(level, r)] = (key, nexts, int(tables.stamps[level, r]))
    return out


def ngram_tables_contents(tables) -> dict:
    """NaiveNGramTables.contents read from the kernels' `Tables` arrays."""
    return {(level, key): nexts for (level, _), (key, nexts, _) in ngram_tables_rows(tables).items()}


def naive_ngram_draft(tables: NaiveNGramTables, context, budget: int, max_depth: int, branching: int):
    """(tokens, parents, depths, scores) of ngram_kernels.draft: every node's children are the
    `branching` best continuations of the longest key ending at that node (context + path), scored
    parent score * count / row total; the best frontier entry is added next (ties: the earliest
    pushed), up to `budget` candidates."""
    context = [int(t) for t in context]
    tokens, parents, depths, scores = [context[-1]], [-1], [0], [F32(1.0)]
    tails = [context[-tables.levels:]]
    frontier = []  # (score, parent, token) in push order
    node = 0
    while True:
        if depths[node] < max_depth:
            hit = tables.longest(tails[node])
            if hit is not None:
                _, row = hit
                total = sum(c for _, c in row.nexts)
                for token, count in row.nexts[:branching]:
                    # float32 parent score times a float64 ratio, rounded to float32 (as the kernel)
                    frontier.append((F32(float(scores[node]) * count / total), node, token))
        if len(tokens) > budget or not frontier:
            break
        best = max(range(len(frontier)), key=lambda f: (frontier[f][0], -f))
        score, parent, token = frontier.pop(best)
        tokens.append(token)
        parents.append(parent)
        depths.append(depths[parent] + 1)
        scores.append(score)
        tails.append((tails[parent] + [token])[-tables.levels:])
        node = len(tokens) - 1
    return tokens, parents, depths, scores


class NaivePool:
    """Lookahead decoding's n-gram pool: `rows` rows, direct-mapped by the hash of an n-gram's first
    token (a new first token evicts the row's old one and its n-grams); a row keeps at most
    `per_key` n-grams (the `gram_len` tokens after the first), the least recently used evicted."""

    def __init__(self, rows: int, per_key: int, gram_len: int):
        self.rows, self.per_key, self.gram_len = rows, per_key, gram_len
        self.table = [None] * rows  # row -> [first token, {gram tuple: last use}]
        self.clock = 0

    def insert(self, first: int, gram) -> None:
        first, gram = int(first), tuple(int(t) for t in gram)
        assert len(gram) == self.gram_len
        row = hash_bucket([first], self.rows)
        self.clock += 1
        if self.table[row] is None or self.table[row][0] != first:
            self.table[row] = [first, {}]
        grams = self.table[row][1]
        if gram not in grams and len(grams) == self.per_key:
            del grams[min(grams, key=grams.get)]
        grams[gram] = self.clock

    def lookup(self, first: int) -> list:
        """The n-grams (tails) that start with `first`, most recently used first."""
        entry = self.table[hash_bucket([int(first)], self.rows)]
        if entry is None or entry[0] != int(first):
            return []
        return sorted(entry[1], key=entry[1].get, reverse=True)

    def contents(self) -> dict:
        """{row: (first token, [(gram, last use), ...] most recent first)}."""
        return {r: (e[0], sorted(e[1].items(), key=lambda kv: -kv[1])) for r, e in enumerate(self.table)
                if e is not None}


def jacobi_pool_contents(pool) -> dict:
    """NaivePool.contents read from the kernels' `Pool` arrays."""
    out = {}
    for r in range(pool.key.shape[0]):
        if pool.key[r] < 0:
            continue
        used = [(tuple(int(t) for t in pool.grams[r, g]), int(pool.stamps[r, g]))
                for g in range(pool.stamps.shape[1]) if pool.stamps[r, g] > 0]
        out[r] = (int(pool.key[r]), sorted(used, key=lambda kv: -kv[1]))
    return out


def window_node_parent(l: int, j: int):
    """The window node (l, j)'s parent as (level, position), or None for the root: level 0 is a
    chain; a level-l token hangs below the level-(l-1) token one position before it."""
    if j == 0:
        return None
    return (0, j - 1) if l == 0 else (l - 1, j - 1)


def naive_window_step(window, n_levels: int, outs, pool: NaivePool):
    """(new window as lists, new level count) after one verify, as ngram_kernels.window_step; `pool`
    (a NaivePool) receives the harvested n-grams. window: (N - 1) x W tokens, its first n_levels
    levels in use; outs: n_levels x W, the model's token at each window node, -1: not evaluated."""
    old = [[int(t) for t in level] for level in window]
    outs = [[int(t) for t in level] for level in outs]
    top_max, width = len(old), len(old[0])
    top = n_levels - 1
    new = [list(level) for level in old]

    def out_at(node):
        return outs[node[0]][node[1]]

    if n_levels == top_max:
        # Harvest: each top node whose diagonal reaches level 0 (down-left, one level and one
        # position per step) ends an n-gram: the diagonal's tokens, then the model's token there.
        for j in range(width):
            diagonal = [(l, j - (top - l)) for l in range(top + 1)]
            if diagonal[0][1] < 0 or out_at((top, j)) < 0:
                continue
            gram = [old[l][p] for l, p in diagonal] + [out_at((top, j))]
            pool.insert(gram[0], gram[1:])
        # Time + position shift: each lower level takes the next level's guesses one position on
        # (new (l, j) holds old (l + 1, j + 1)); the top takes the model's tokens in place.
        for l in range(top):
            for j in range(width - 1):
                new[l][j] = old[l + 1][j + 1]
            # The last position: the model's token at the old node that now sits at its parent.
            # Its new parent is (l - 1, W - 2), or (0, W - 2) for level 0, which holds old
            # (l, W - 1), resp. old (1, W - 1) (with W = 1 the kernel takes the same nodes).
            source = (l, width - 1) if l > 0 else (1, width - 1)
            new[l][width - 1] = out_at(source) if out_at(source) >= 0 else old[l + 1][width - 1]
        for j in range(width):
            new[top][j] = out_at((top, j)) if out_at((top, j)) >= 0 else old[top][j]
        return new, n_levels
    # Filling: each level moves one position on, its last position the model's token at the old node
    # now at its parent; a new level above takes the top's tokens (a guess one iteration newer).
    for l in range(n_levels):
        for j in range(width - 1):
            new[l][j] = old[l][j + 1]
        parent_source = (l - 1, width - 1) if l > 0 else (0, width - 1)  # new parent's old node
        if out_at(parent_source) >= 0:
            new[l][width - 1] = out_at(parent_source)
    for j in range(width):
        new[n_levels][j] = out_at((top, j)) if out_at((top, j)) >= 0 else old[top][j]
    return new, n_levels + 1


def naive_merge_trees(root: int, tokens, parents, priority, sources, budget: int):
    """(tokens, parents, depths, scores, source bits, each input node's index) of
    ngram_kernels.merge: the union of the trees' token paths (concatenated trees, parents -1 under
    the root); a path's priority is the least along it of the best priority any tree gives each of
    its prefixes; best first (ties: the order in which paths first appear), cut to `budget`
    candidates; an input node's index is its path's in the result, -1 where the cut dropped it."""
    best, bits, first_seen = {}, {}, []
    paths = []
    for i in range(len(tokens)):
        path = (paths[int(parents[i])] if parents[i] >= 0 else ()) + (int(tokens[i]),)
        paths.append(path)
        if path not in best:
            first_seen.append(path)
            best[path] = F32(priority[i])
            bits[path] = 0
        best[path] = max(best[path], F32(priority[i]))
        bits[path] |= 1 << int(sources[i])
    score = {}
    for path in first_seen:  # a prefix appears first, so its score is known
        score[path] = best[path] if len(path) == 1 else min(best[path], score[path[:-1]])
    order = sorted(range(len(first_seen)), key=lambda k: (-score[first_seen[k]], k))[:budget]
    kept = [first_seen[k] for k in order]
    index = {path: r + 1 for r, path in enumerate(kept)}
    out_tokens, out_parents, out_depths, out_scores, out_bits = [int(root)], [-1], [0], [F32(1.0)], [0]
    for path in kept:
        out_tokens.append(path[-1])
        out_parents.append(index[path[:-1]] if len(path) > 1 else 0)
        out_depths.append(len(path))
        out_scores.append(score[path])
        out_bits.append(bits[path])
    return out_tokens, out_parents, out_depths, out_scores, out_bits, [index.get(path, -1) for path in paths]


# -- the row drafter --------------------------------------------------------------------------------
class NaiveRowDrafter:
    """RowDrafter's rules written out with the identities a test engine knows (tests/row_engine.py):
    one real TrieRequest per request id (the trie kernels have their own twin, NaiveTrie), started,
    updated and finished through the Drafter protocol; a request's state index is the lowest free
    one when it first drafts (RowDrafter's table order, which fixes the order requests end in); the
    chain of first children cut by the cost rule with a calibration kept in Python floats.

    `by_row=True` plants the bug the row drafter must not have: a row's state is the state its row
    held last step, whoever holds the row now."""

    BINS, RANKS = 20, 6

    def __init__(self, drafter, *, max_rows, max_len, max_draft, token_cost, tree_nodes, memory, explore=0.25,
                 row_cost=0.16, by_row=False):
        self.drafter, self.max_rows, self.max_len, self.max_draft = drafter, max_rows, max_len, max_draft
        self.explore, self.row_cost = explore, row_cost
        self.token_cost, self.tree_nodes, self.by_row = token_cost, tree_nodes, by_row
        self.keep = 1.0 - 1.0 / memory
        centres = [(b + 0.5) / self.BINS for b in range(self.BINS)]
        self.prior = {(b, k): (2.0, 2.0 * centres[b]) for b in range(self.BINS) for k in range(self.RANKS)}
        self.cells = dict(self.prior)   # (bin, rank) -> [offered, accepted]
        self.states = {}                # request id -> dict(index, request, n, chain, cells)
        self.row_ids = {}               # by_row: row -> the id whose state that row held

    def propose(self, rows, n_tokens, active, ids):
        """ids[r]: the request in row r (None: empty). Returns (chains: list of lists)."""
        n = len(n_tokens)
        if self.by_row:   # the planted bug: a row keeps its state, whoever holds it now
            ids = [self.row_ids.get(r, ids[r]) if ids[r] is not None else None for r in range(n)]
            for r in range(n):
                if ids[r] is not None:
                    self.row_ids[r] = ids[r]
        present = {q for q in ids if q is not None}
        for q in sorted((q for q in self.states if q not in present), key=lambda q: self.states[q]["index"]):
            self.states.pop(q)["request"].finish()
        self.cells = {c: (self.prior[c][0] + self.keep * (o - self.prior[c][0]),
                          self.prior[c][1] + self.keep * (a - self.prior[c][1])) for c, (o, a) in self.cells.items()}
        chains = [[] for _ in range(n)]
        drafting = []
        for r in range(n):   # the rows' new tokens first: every row is cut with the same calibration
            q, n_row = ids[r], int(n_tokens[r])
            if q is None:
                continue
            st = self.states.get(q)
            if not active[r] or n_row == 0:
                if st is not None:
                    st["chain"], st["cells"] = [], []
                continue
            row = [int(t) for t in rows[r, :n_row]]
            if st is None:
                used = {s["index"] for s in self.states.values()}
                index = min(i for i in range(self.max_rows) if i not in used)
                request = self.drafter.start(np.array(row[:-1], np.int32))
                request.update(np.array(row[-1:], np.int32))
                st = self.states[q] = dict(index=index, request=request, n=n_row, chain=[], cells=[])
            else:
                self._learn(st, row)
                if n_row > st["n"]:
                    st["request"].update(np.array(row[st["n"]:], np.int32))
                st["n"] = n_row
            drafting.append((r, st, row))
        n = len(drafting)   # rows verified in this step share it: a drafted token costs more of a row's share
        cost = self.token_cost if n <= 1 else self.token_cost * (1.0 + self.row_cost) / (1.0 / n + self.row_cost)
        for r, st, row in drafting:
            limit = min(self.max_draft, self.max_len - 1 - len(row))
            if limit > 0:
                tree = st["request"].propose(np.array(row, np.int32), self.tree_nodes)
                chains[r] = self._cut(st, tree, limit, cost)
        return chains

    def _learn(self, st, row):
        chain = st["chain"]
        new = row[st["n"]:]
        accepted = 0
        while accepted < len(chain) and accepted < len(new) - 1 and new[accepted] == chain[accepted]:
            accepted += 1
        for j, cell in enumerate(st["cells"]):
            o, a = self.cells[cell]
            self.cells[cell] = (o + 1.0, a + (1.0 if j < accepted else 0.0))
        st["chain"], st["cells"] = [], []

    def _cut(self, st, tree, limit, token_cost):
        chain, cells, last = [], [], 0
        for i in range(1, tree.n_candidates):
            if len(chain) >= limit:
                break
            if tree.parents[i] != last:
                continue
            b = min(max(int(float(tree.scores[i]) * self.BINS), 0), self.BINS - 1)
            k = min(int(np.log2(len(chain) + 1)), self.RANKS - 1)
            chain.append(int(tree.tokens[i]))
            cells.append((b, k))
            last = i
        best_m, best_value, expected = 0, 1.0, 1.0
        for m, cell in enumerate(cells, start=1):
            o, a = self.cells[cell]
            expected += min(a / o + self.explore / math.sqrt(o), 1.0)   # optimism where evidence is thin
            value = expected / (1.0 + token_cost * m)
            if value > best_value:
                best_m, best_value = m, value
        st["chain"], st["cells"] = chain[:best_m], cells[:best_m]
        return chain[:best_m]


# -- what a proposal would have done, and what the budget expects of it -----------------------------
def naive_would_accept(tokens, parents, continuation) -> list:
    """Per node: 1 if root..node's tokens after the root are a prefix of `continuation`, 0 if they
    differ from it somewhere, -1 if they agree with all of it but reach beyond it."""
    out = []
    for i in range(len(tokens)):
        path = []
        node = i
        while node > 0:
            path.append(int(tokens[node]))
            node = int(parents[node])
        path.reverse()
        known = [int(t) for t in continuation[:len(path)]]
        if path[:len(known)] != known:
            out.append(0)
        elif len(path) > len(continuation):
            out.append(-1)
        else:
            out.append(1)
    return out


def naive_expected_accepted(p, parents, k: int) -> float:
    """Expected accepted candidates of the tree's first k candidates: each node's probability is its
    calibrated p scaled by min(1, parent's probability / sum of p over its siblings among the k)."""
    q = {0: 1.0}
    for i in range(1, k + 1):
        siblings = [j for j in range(1, k + 1) if parents[j] == parents[i]]
        total = sum(p[j] for j in siblings)
        q[i] = p[i] * min(1.0, q[int(parents[i])] / total)
    return sum(q[i] for i in range(1, k + 1))
