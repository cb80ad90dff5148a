"""`sps` with `tree=true`: the draft model drafts a tree of tokens, the target verifies its likeliest nodes in one
tree-masked pass (SpecInfer, Miao et al. 2024; the level-by-level growth and the cost cut of EAGLE-2, as `eagle`
does them with its feature draft: paradec/strategies/eagle.py).

Each step: the draft reads the settled tokens it has not cached and gives the root's distribution; its `branch`
likeliest tokens are the first level. Each further level is one draft pass over the `width` likeliest nodes of the
newest level (a node's score: the draft's joint log-probability of its path), each row seeing the cached context,
its ancestors and itself (a tree mask over the draft's cache), until `depth` levels or until the nodes to expand hold
less than `stop` of the draft's probability. Of the tree, the target verifies the likeliest nodes, as many as
maximise (1 + their summed probability) / (the draft passes' measured cost + the measured cost of a target pass that
wide), at most `nodes` (`eagle.choose`), in one pass with the tree mask; `verification.tree` walks the path the
target accepts - greedy: the child equal to the target's argmax; sampled: each child in turn with probability
p(child) / (mass left), its mass removed when refused, which leaves the output distributed as the target's - and
the target's cache keeps that path (`Engine.keep`). The draft's cache drops the tree; the next step feeds it the
accepted tokens. With `adaptive`, a step drafts only while drafting steps make more tokens per modelled second
than plain ones (`eagle.TreeRule`). With `lookup` the copy `pld` would propose is grafted into the tree, priced by
this run's copies, as `eagle` does it (`eagle.TreeCopies`); a step the rule pauses may still verify the copy alone.

A chain drafts k tokens in k draft passes and loses the rest of the step at the first refusal; a tree offers the
target the draft's second and third choices too, at the cost of rows in one target pass: worth it where a pass over
a dozen rows costs about one row's (bfloat16 on a CPU with AMX: 16 rows 1.2x one, a GPU).
"""
from __future__ import annotations

import math
import time

import torch

from .. import passcost, verification
from ..engine import Engine
from .base import Run


def log_probs(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Draft logits (..., V_d) -> log-probabilities over the target's vocabulary (`fit_vocab`: a column is a token
    id; ids the draft lacks get -inf)."""
    from .speculative import fit_vocab
    return torch.log_softmax(fit_vocab(logits.float(), vocab_size), -1)


def expansion_mask(cached: int, dlen: int, expand: list[int], parents: list[int], slot: dict) -> torch.Tensor:
    """(E, cached + E) 'may attend' of a draft pass expanding the tree nodes `expand`: each row sees the context
    (the cache's first dlen positions), its ancestors (the cache's position dlen + slot[ancestor]) and itself."""
    E = len(expand)
    allowed = torch.zeros(E, cached + E, dtype=torch.bool)
    allowed[:, :dlen] = True
    for r, i in enumerate(expand):
        a = parents[i]
        while a >= 0:
            allowed[r, dlen + slot[a]] = True
            a = parents[a]
        allowed[r, cached + r] = True
    return allowed


def grow_tree(first: tuple, level, dcache, dlen: int, depth: int, width: int, stop: float):
    """A tree (eagle.Tree) grown level by level - the growth `sps` and `eagle` share. first: (scores, tokens), one
    row of the root's children (log-probabilities, token ids). Each further level expands the `width` nodes of the
    newest one with the best path scores in one draft pass, `level(expand, tokens, parents, allowed, position)` ->
    (scores, tokens) rows of children for each node in `expand`: it feeds those nodes' tokens at `position` with the
    (E, cached + E) mask `allowed` (`expansion_mask`) to the draft, whose cache holds the context's dlen positions
    and then the nodes expanded so far (crop it to dlen afterwards). Stops after `depth` levels, or once the nodes
    to expand hold less than `stop` of the draft's probability."""
    from .eagle import Tree
    tok, par, dep, score = [], [], [], []
    slot = {}

    def add(vs, ts, parents, d):
        new = []
        for row, p in enumerate(parents):
            for v, t in zip(vs[row], ts[row]):
                tok.append(int(t)), par.append(p), dep.append(d)
                score.append((score[p] if p >= 0 else 0.0) + v)
                new.append(len(tok) - 1)
        return new

    frontier = add(*first, [-1], 1)
    passes = 1
    for d in range(2, depth + 1):
        expand = sorted(frontier, key=lambda i: -score[i])[:width]
        if sum(math.exp(score[i]) for i in expand) < stop:
            break
        C = Engine.cache_len(dcache)
        vs, ts = level(expand, tok, par, expansion_mask(C, dlen, expand, par, slot), dlen + d - 2)
        for r, i in enumerate(expand):
            slot[i] = C - dlen + r
        frontier = add(vs, ts, expand, d)
        passes += 1
    return Tree(tok, par, dep, [math.exp(x) for x in score], passes)


def grow(draft: Engine, vocab_size: int, lp_root: torch.Tensor, dcache, dlen: int, depth: int, branch: int,
         width: int, stop: float):
    """`sps`'s tree from the draft's log-probabilities lp_root (V,) at the context's last position (`grow_tree`)."""
    def children(lp):                        # (E, V) -> each row's best `branch` scores and token ids
        v, i = lp.topk(min(branch, lp.shape[-1]), -1)
        return v.tolist(), i.tolist()

    def level(expand, tok, par, allowed, position):
        logits = draft.forward([tok[i] for i in expand], dcache, torch.full((1, len(expand)), position),
                               draft.additive(allowed), logits_to_keep=len(expand), upcast=False)[0]
        return children(log_probs(logits, vocab_size))

    return grow_tree(children(lp_root[None]), level, dcache, dlen, depth, width, stop)


def verify(engine: Engine, tcache, seq: list[int], fed: int, tokens: list[int], parents: list[int],
           depths: list[int], sp, rng):
    """One target pass over the tokens it has not cached (seq[fed:]) and a drafted tree (tokens, parents, depths;
    none: a plain pass), tree-masked; `verification.tree` walks the path the target accepts and the target's cache
    keeps that path (`Engine.keep`). The verify step of `sps` and `eagle` with a tree. Returns (verdict, path)."""
    from .eagle import tree_mask
    base, n = len(seq), len(tokens)
    if n:
        positions = torch.tensor([list(range(fed, base)) + [base - 1 + d for d in depths]])
        logits = engine.forward(seq[fed:] + tokens, tcache, positions,
                                engine.tree_mask(fed, tree_mask(base - fed, parents)), logits_to_keep=n + 1,
                                upcast=False)[0]
    else:                                   # a plain pass (the prompt's, or a paused step): the causal mask
        logits = engine.forward(seq[fed:], tcache, logits_to_keep=1, upcast=False)[0]
    v, path = verification.tree(tokens, parents, logits, sp, rng)
    engine.keep(tcache, base, path)
    return v, path


def tree_steps(run: Run, draft: Engine):
    """`sps`'s steps with a drafted tree (the module's docstring); same Step figures as `eagle`'s tree."""
    from .eagle import TREE_WIDTHS, Tree, TreeCopies, TreeRule, choose
    engine, request, p, out, tcache = run.engine, run.request, run.params, run.out, run.cache
    sp = request.sampling
    rng = verification.Rng(request.seed)
    seq = list(run.ids)
    dcache = draft.new_cache()
    costs = passcost.pass_costs(engine, TREE_WIDTHS)
    dcosts = passcost.pass_costs(draft, [1, p["width"]])
    rule = TreeRule(passcost.cost_at(costs, 1)) if p["adaptive"] else None
    copies = TreeCopies(seq, p["lookup"]) if p["lookup"] else None      # `lookup`: a copy grafted in, as eagle's
    prefill = True
    while True:
        room = out.budget - len(out.ids) - 1
        base, fed = len(seq), engine.cache_len(tcache)
        t0 = time.perf_counter()
        tree = grown = Tree([], [], [], [], 0)
        spent, copied = 0.0, 0
        drafts = not prefill and room > 0 and (rule is None or rule.draft_now())
        if drafts:
            with torch.inference_mode():
                lg = draft.forward(seq[draft.cache_len(dcache):], dcache, logits_to_keep=1, upcast=False)[0, -1]
                dlen = draft.cache_len(dcache)
                grown = grow(draft, engine.vocab_size, log_probs(lg, engine.vocab_size), dcache, dlen,
                             min(p["depth"], room), p["branch"], p["width"], p["stop"])
            spent = dcosts[1] + (grown.passes - 1) * dcosts[p["width"]]
            Engine.crop(dcache, dlen)
        if copies is not None and not prefill:
            grown, copied = copies.graft(grown, room)
        if grown.tokens:
            tree = choose(grown, base - fed, lambda w: spent + passcost.cost_at(costs, w), p["nodes"] + copied)
        drafting = time.perf_counter() - t0
        tokens, parents, depths = tree.tokens, tree.parents, tree.depths
        n = len(tokens)
        v, path = verify(engine, tcache, seq, fed, tokens, parents, depths, sp, rng)
        seq += v.tokens
        if copies is not None:
            copies.settled(v.tokens, tree, path)
        if rule is not None and drafts:         # credited with the drafted tokens it accepted, not the copied
            drafted = sum(1 for i in path if not tree.origin or tree.origin[i] != "c")
            rule.update(drafted, spent + passcost.cost_at(costs, base - fed + n))
        step = out.step(v.tokens, forward_passes=1, draft_passes=tree.passes, drafted=n, prefill=prefill,
                        info={"nodes": n, "depth": max(depths, default=0),
                              "copied": sum(o != "d" for o in tree.origin), "draft_s": drafting})
        step.accepted = min(v.accepted, len(step.token_ids))
        yield step
        if out.done:
            return
        prefill = False
