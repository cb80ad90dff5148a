"""`eagle`: speculative decoding with a feature-level draft (EAGLE, Li et al. 2024; paradec/feature_draft.py).

The draft is one decoder layer that reads the target's own final hidden states: each target pass leaves the
hidden state of every position it fed, and the draft, given the feature f_j and the token t_{j+1} that followed,
predicts f_{j+1} and so the token after. A step: the draft first reads the true features of the positions the
last target pass settled (one draft pass, usually a few positions wide) and proposes a token; each further
proposal reads the draft's own predicted feature (one draft pass each); then one target pass over the uncached
tokens plus the k proposals verifies them exactly as `sps` does (`verification.greedy`: longest prefix equal to
the target's argmax, so the output is `ar`'s; `verification.rejection` when sampling: distributed exactly as
the target's), and leaves the true features of what it accepted for the next step (with a draft that reads aux
layers, EAGLE-3's fused features, those layers' parts too: `feature_draft.capture`). The draft's cache keeps only
positions it read with true features. The first step is a plain target pass over the prompt (there are no
features before it). k follows the same cost rule as `sps` (`speculative.CostRule`): the running acceptance
rate against the target's measured pass costs and the draft's measured step cost; k may be 0 (a plain step).

`tree` (the default) drafts a tree instead of a chain (EAGLE-2, Li et al. 2024): the draft's first pass gives
the `branch` likeliest first tokens; each further draft pass expands the `width` likeliest of the newest nodes
(by the draft's joint probability of the node's path) into their `branch` likeliest children, all in one pass
with a tree mask over the draft's cache, up to `depth` levels, stopping early once the nodes to expand hold less
than `stop` of the draft's probability together. The target then verifies the likeliest nodes in one pass with
a tree mask (`verification.tree`), as many as pay by the measured pass costs (paradec/passcost.py: the expected
accepted tokens, 1 + the sum of the chosen nodes' probabilities, per second of the step), at most `nodes`; its
cache keeps the accepted path (`Engine.keep`). With `adaptive` (`TreeRule`) drafting pauses (probing every few
steps) while drafting steps yield fewer tokens per modelled second than plain ones. The children of a node are fixed by the draft, not sampled, and
verification tries them in order against the target's distribution with the refused ones removed, so sampled
output is distributed exactly as the target's; greedy output is `ar`'s token for token.

`lookup` (tree only) adds what `pld` would propose: the tokens that followed the most recent earlier occurrence
of the context's last 1-3 tokens, hung under the root as a chain that follows the draft's nodes where they hold
the same tokens (`graft`). Each copied token is given the probability its position in the chain implies at the
running rate copied tokens were accepted (`CopyRate`, per n-gram length), so the same measured-cost cut decides
how many of them the target verifies; when the adaptive rule pauses drafting, the copy alone may still be
verified. Fixed tokens, tried in order like the draft's: the output stays exact.

Invariant between steps: `seq` is prompt + output; the target cache holds a prefix of `seq` (all but at least
its last token); `feats` holds the true features of positions dlen .. len(seq) - 2, the draft cache positions
0 .. dlen - 1.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import torch

from .. import feature_draft as FD
from .. import passcost, verification
from ..engine import Engine, ModelError
from ..sampling import argmax
from .base import Param, Run, Strategy, register
from .prompt_lookup import LOOKUP_NGRAM, ContextIndex, CopyRate
from .speculative import DECAY, K_MAX, PROBE_EVERY, CostRule, draft_step, tree_params
from .speculative_tree import grow_tree, verify

TRAIN = "train it: python -m paradec train eagle --model MODEL"
_LOCK = threading.Lock()


class NoFeatureDraft(ModelError):
    """No feature draft for this model."""


def feature_draft(engine) -> FD.FeatureDraft:
    """The engine's feature draft: engine.extras['eagle'] (tests and callers may put one there), else the one
    shipped for its model (data/drafts/<model>/eagle/), loaded once."""
    if engine.extras.get("eagle") is not None:
        return engine.extras["eagle"]
    folder = FD.shipped_dir(engine.name)
    if not FD.is_feature_draft_dir(folder):
        raise NoFeatureDraft(f"no eagle draft for {engine.name}: {TRAIN}")
    with _LOCK:
        if engine.extras.get("eagle") is None:
            try:
                engine.extras["eagle"] = FD.load(folder, engine)
            except ValueError as e:
                raise ModelError(str(e)) from e
    return engine.extras["eagle"]


def preload(engine) -> None:
    """Load the engine's feature draft (when it has one) and time its step and the tree's pass widths now, before
    any request thread."""
    try:
        fd = feature_draft(engine)
    except NoFeatureDraft:
        return
    step_cost(engine, fd)
    step_cost(engine, fd, rows=Eagle.params["width"].default)
    passcost.pass_costs(engine, TREE_WIDTHS)


def step_cost(engine, fd: FD.FeatureDraft, repeats: int = 5, rows: int = 1) -> float:
    """Seconds of one draft step over `rows` positions (after a short cached context, plus the head over every
    row: a tree's expanding passes have `width` rows), the fastest of `repeats`; measured once per engine, draft
    and row count."""
    memo = engine.extras.setdefault("eagle_cost", {})
    if (id(fd), rows) not in memo:
        hsz = int(engine.model.config.hidden_size)
        with torch.inference_mode():
            cache = fd.new_cache()
            fd.hidden(torch.zeros(1, 32, hsz, dtype=engine.dtype, device=engine.device),
                      torch.zeros(1, 32, dtype=torch.long), cache)
            best = float("inf")
            for _ in range(repeats):
                engine.sync()
                t = time.perf_counter()
                h = fd.hidden(torch.zeros(1, rows, hsz, dtype=engine.dtype, device=engine.device),
                              torch.zeros(1, rows, dtype=torch.long), cache)
                argmax(fd.logits(h[0])).tolist()
                engine.sync()
                best = min(best, time.perf_counter() - t)
                cache.crop(-rows)
        memo[(id(fd), rows)] = best
    return memo[(id(fd), rows)]


TREE_WIDTHS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)     # target pass widths timed for the tree's size


@dataclass
class Tree:
    tokens: list[int]       # node i's token; its parent parents[i] (-1: the context's last token) comes first
    parents: list[int]
    depths: list[int]       # 1 for the root's children
    probs: list[float]      # the draft's joint probability of the path to node i
    passes: int             # draft passes it took
    origin: list[str] = field(default_factory=list)   # per node: "d" drafted, "c" copied (`graft`), "b" both;
    #                                                   empty: every node drafted


def grow(fd: FD.FeatureDraft, engine, h_root: torch.Tensor, dcache, dlen: int, depth: int, branch: int,
         width: int, stop: float) -> Tree:
    """Draft a tree from the draft's predicted feature h_root (hidden,) of the context's last position; the draft
    cache holds positions 0 .. dlen - 1 and gets the expanded nodes after them (crop it to dlen afterwards).
    Expansion stops once the nodes to expand hold less than `stop` of the probability."""
    kept = fd.kept_ids
    out_h = {}

    def children(h):                        # (E, hidden) -> log-probs and token ids of each row's best `branch`
        lp = torch.log_softmax(fd.kept_logits(h).float(), -1)
        v, i = lp.topk(min(branch, lp.shape[-1]), -1)
        return v.tolist(), kept[i.cpu()].tolist()

    def level(expand, tok, par, allowed, position):
        feats = torch.stack([h_root if par[i] < 0 else out_h[par[i]] for i in expand])[None]
        h = fd.hidden(feats, torch.tensor([[tok[i] for i in expand]]), dcache,
                      torch.full((1, len(expand)), position, dtype=torch.long, device=feats.device),
                      engine.additive(allowed))[0]
        for r, i in enumerate(expand):
            out_h[i] = h[r]
        return children(h)

    return grow_tree(children(h_root[None]), level, dcache, dlen, depth, width, stop)


def choose(tree: Tree, pending: int, cost, nodes: int) -> Tree:
    """The nodes the target verifies: the likeliest ones (a node's path is never less likely than its parent's, so
    they form a tree), as many as maximise (1 + their summed probability) / cost(pending + their count), at most
    `nodes`; in creation order, so parents come first and siblings in the draft's order."""
    order = sorted(range(len(tree.tokens)), key=lambda i: (-tree.probs[i], i))
    chosen: set[int] = set()
    for i in order:                             # ties at probability 1.0 could put a child first: keep closure
        if len(chosen) >= nodes:
            break
        if tree.parents[i] < 0 or tree.parents[i] in chosen:
            chosen.add(i)
    ranked = [i for i in order if i in chosen]
    best, best_rate, mass = 0, 1.0 / cost(pending), 1.0
    for n, i in enumerate(ranked, 1):
        mass += tree.probs[i]
        if mass / cost(pending + n) > best_rate:
            best, best_rate = n, mass / cost(pending + n)
    keep = sorted(ranked[:best])
    at = {i: r for r, i in enumerate(keep)}
    return Tree([tree.tokens[i] for i in keep], [at.get(tree.parents[i], -1) for i in keep],
                [tree.depths[i] for i in keep], [tree.probs[i] for i in keep], tree.passes,
                [tree.origin[i] for i in keep] if tree.origin else [])


def graft(tree: Tree, copy: list[int], probs: list[float]) -> Tree:
    """`tree` with the chain `copy` (tokens copied from the context, as `pld` proposes them) hung under the root;
    probs[j]: the estimated probability that the copy's first j + 1 tokens are all accepted. Where the node the
    chain has reached already has a child with the chain's next token, the chain follows it (origin "b", its
    probability the larger of the two), else it goes on as new nodes (origin "c"), so siblings keep distinct
    tokens and a path stays no likelier than its prefix. Appended nodes come after the draft's."""
    tok, par, dep, pr = list(tree.tokens), list(tree.parents), list(tree.depths), list(tree.probs)
    origin = list(tree.origin) or ["d"] * len(tok)
    child = {(p, t): i for i, (p, t) in enumerate(zip(par, tok))}
    node = -1
    for j, (t, q) in enumerate(zip(copy, probs)):
        i = child.get((node, int(t)))
        if i is None:
            tok.append(int(t)), par.append(node), dep.append(j + 1), pr.append(q), origin.append("c")
            i = child[(node, int(t))] = len(tok) - 1
        else:
            pr[i] = max(pr[i], q)
            origin[i] = "b" if origin[i] != "c" else "c"
        node = i
    return Tree(tok, par, dep, pr, tree.passes, origin)


def copy_record(rates: CopyRate, n: int, tree: Tree, path: list[int]) -> None:
    """Credit `rates` with a step's copied nodes (origin not "d") that were tried - hung under the root or under a
    node on the accepted path - and which of them were accepted."""
    on = set(path)
    tries = [i for i, o in enumerate(tree.origin) if o != "d" and (tree.parents[i] < 0 or tree.parents[i] in on)]
    rates.record(n, len(tries), sum(i in on for i in tries))


class TreeCopies:
    """`lookup` on a drafted tree (`eagle` and `sps` with tree=true): each step the copy `pld` would propose for the
    context (`ContextIndex`, at most `most` tokens) is grafted in (`graft`) with the probabilities this run's copies
    earned (`CopyRate`, per n-gram length); after the step the settled tokens join the index and the tried copied
    nodes are credited (`copy_record`)."""

    def __init__(self, ids, most: int):
        self.most, self.ngram = most, 0
        self.index = ContextIndex(LOOKUP_NGRAM)
        self.index.extend(ids)
        self.rates = CopyRate()

    def graft(self, tree: Tree, room: int) -> tuple[Tree, int]:
        """(`tree` with this step's copy grafted in, how many tokens were copied)."""
        copy, self.ngram = self.index.match(min(self.most, room)) if room > 0 else ([], 0)
        return (graft(tree, copy, self.rates.probs(self.ngram, len(copy))), len(copy)) if copy else (tree, 0)

    def settled(self, tokens: list[int], tree: Tree, path: list[int]) -> None:
        self.index.extend(tokens)
        copy_record(self.rates, self.ngram, tree, path)


class TreeRule:
    """Whether a tree pays on this text, from this run's own steps. `draft_now`: whether to draft this step, from
    the decayed tokens per modelled second of the steps that drafted (their draft passes at the draft's measured
    step cost plus their verify pass at the measured cost of its width) against a plain step's (the measured
    one-position pass). Costs measured once at
    start, not each step's wall time: on a shared 2-core machine a pass's time drifts by 2x within a minute, and a
    rule reading wall time paused drafting on noise (docs/bench/eagle-tree-tune.md). When plain steps pay more,
    only every PROBE_EVERY + 1-th step drafts, so the figures keep up with the text."""

    def __init__(self, plain_seconds: float):
        self.tokens = self.seconds = None
        self.plain = plain_seconds
        self.idle = 0

    def draft_now(self) -> bool:
        if self.tokens is None or self.tokens / self.seconds >= 1.0 / self.plain:
            self.idle = 0
            return True
        self.idle += 1
        if self.idle > PROBE_EVERY:
            self.idle = 0
            return True
        return False

    def update(self, accepted: int, seconds: float) -> None:
        """After a step that drafted: the accepted count and the step's modelled seconds."""
        self.tokens = accepted + 1 if self.tokens is None else DECAY * self.tokens + accepted + 1
        self.seconds = seconds if self.seconds is None else DECAY * self.seconds + seconds


def tree_mask(pending: int, parents: list[int]) -> torch.Tensor:
    """(T, T) 'may attend' among a pass's new positions: the pending tokens causally, each node every pending token,
    its ancestors and itself."""
    n = len(parents)
    allowed = torch.zeros(pending + n, pending + n, dtype=torch.bool)
    allowed[:pending, :pending] = torch.ones(pending, pending, dtype=torch.bool).tril()
    allowed[pending:, :pending] = True
    for i, p in enumerate(parents):
        allowed[pending + i, pending + i] = True
        while p >= 0:
            allowed[pending + i, pending + p] = True
            p = parents[p]
    return allowed


@register
class Eagle(Strategy):
    name = "eagle"
    title = "Speculative decoding (feature-level draft, EAGLE)"
    lossless = True
    params = {
        "k": Param(4, int, 1, K_MAX, help="tokens drafted per step (the start value when adaptive)"),
        "adaptive": Param(True, bool, help="chain: choose k after every step by the cost rule (as sps's rule "
                                           "'cost'); tree: draft only while drafting steps beat plain ones"),
        "tree": Param(True, bool, help="draft a tree (EAGLE-2) instead of a chain of k tokens"),
        **tree_params(),
        "lookup": Param(8, int, 0, 32, help="tree: also offer up to this many tokens copied from the context "
                                            "after the longest earlier match of its last 1-3 tokens (as pld), "
                                            "merged into the tree and kept by the same cost cut, on top of "
                                            "`nodes`; 0: off"),
    }

    def available(self, engine) -> tuple[bool, str]:
        try:
            feature_draft(engine)
        except ModelError as e:
            return False, str(e)
        return True, ""

    def steps(self, run: Run):
        if run.params["tree"]:
            yield from self.tree_steps(run)
            return
        engine, request, p, out, tcache = run.engine, run.request, run.params, run.out, run.cache
        fd = feature_draft(engine)
        sp = request.sampling
        rng = verification.Rng(request.seed)
        seq = list(run.ids)
        dcache, dlen, feats = fd.new_cache(), 0, None
        k, prefill = p["k"], True
        rule = CostRule(engine, draft_cost=step_cost(engine, fd)) if p["adaptive"] else None
        while True:
            kk = 0 if feats is None else max(0, min(k, out.budget - len(out.ids) - 1))
            proposals, qs = [], []
            t0 = time.perf_counter()
            timed = feats is not None and feats.shape[1] <= 8      # not the draft's own prefill
            if kk:
                with torch.inference_mode():
                    h = fd.hidden(feats, torch.tensor([seq[dlen + 1:]]), dcache)[:, -1:]
                    dlen, feats = len(seq) - 1, feats[:, :0]
                    for i in range(kk):
                        x = verification.draft_pick(fd.logits(h[0, -1]), sp, rng, qs)
                        proposals.append(x)
                        if i + 1 < kk:
                            h = fd.hidden(h, torch.tensor([[x]]), dcache)
            spent = time.perf_counter() - t0
            draft_seconds = spent if timed else None
            base, fed = len(seq), engine.cache_len(tcache)
            with FD.capture(engine, fd.aux) as got:
                logits = engine.forward(seq[fed:] + proposals, tcache, logits_to_keep=kk + 1, upcast=False)[0]
            v = verification.draft_verdict(proposals, qs, logits, sp, rng)
            engine.crop(tcache, base + v.accepted)
            Engine.crop(dcache, dlen)
            # true features of the positions settled now (fed .. base + accepted - 1) join the unread ones
            new = got[-1][:, :base + v.accepted - fed]
            feats = new if feats is None else torch.cat([feats[:, :fed - dlen], new], 1)
            seq += v.tokens
            yield draft_step(out, v, kk, prefill, spent)
            if out.done:
                return
            prefill = False
            if rule is not None:
                k = rule.next_k(kk, v.accepted, draft_seconds)

    def tree_steps(self, run: Run):
        engine, request, p, out, tcache = run.engine, run.request, run.params, run.out, run.cache
        fd = feature_draft(engine)
        sp = request.sampling
        rng = verification.Rng(request.seed)
        seq = list(run.ids)
        dcache, dlen, feats = fd.new_cache(), 0, None
        costs = passcost.pass_costs(engine, TREE_WIDTHS)
        draft_cost = step_cost(engine, fd, rows=p["width"])
        rule = TreeRule(passcost.cost_at(costs, 1)) if p["adaptive"] else None
        copies = TreeCopies(seq, p["lookup"]) if p["lookup"] else None
        prefill = True
        while True:
            room = out.budget - len(out.ids) - 1
            base, fed = len(seq), engine.cache_len(tcache)
            tree = grown = Tree([], [], [], [], 0)
            t0 = time.perf_counter()
            drafts = feats is not None and room > 0 and (rule is None or rule.draft_now())
            if drafts:
                with torch.inference_mode():
                    h = fd.hidden(feats, torch.tensor([seq[dlen + 1:]]), dcache)[0, -1]
                    dlen, feats = len(seq) - 1, feats[:, :0]
                    grown = grow(fd, engine, h, dcache, dlen, min(p["depth"], room), p["branch"], p["width"],
                                 p["stop"])
            copied = 0
            if copies is not None and feats is not None:
                grown, copied = copies.graft(grown, room)
            if grown.tokens:
                spent = grown.passes * draft_cost
                tree = choose(grown, base - fed, lambda w: spent + passcost.cost_at(costs, w), p["nodes"] + copied)
            drafting = time.perf_counter() - t0
            P, n = base - fed, len(tree.tokens)
            with FD.capture(engine, fd.aux) as got:
                v, path = verify(engine, tcache, seq, fed, tree.tokens, tree.parents, tree.depths, sp, rng)
            Engine.crop(dcache, dlen)
            g = got[-1][0]
            new = torch.cat([g[:P], g[P + torch.tensor(path, dtype=torch.long, device=g.device)]])[None]
            feats = new if feats is None else torch.cat([feats[:, :fed - dlen], new], 1)
            seq += v.tokens
            if copies is not None:
                copies.settled(v.tokens, tree, path)
            if rule is not None and drafts:         # credited with the drafted tokens it accepted, not the copied
                drafted = sum(1 for i in path if not tree.origin or tree.origin[i] != "c")
                rule.update(drafted, tree.passes * draft_cost + passcost.cost_at(costs, P + n))
            step = out.step(v.tokens, forward_passes=1, draft_passes=tree.passes, drafted=n, prefill=prefill,
                            info={"nodes": n, "depth": max(tree.depths, default=0),
                                  "copied": sum(o != "d" for o in tree.origin), "draft_s": drafting})
            step.accepted = min(v.accepted, len(step.token_ids))
            yield step
            if out.done:
                return
            prefill = False

