"""`lookahead`: lookahead decoding (Fu et al. 2024) - Jacobi iteration plus n-gram verification, one pass.

Written against `engine.forward` with an explicit tree attention mask and position ids, so it runs on any
causal LM that accepts a 4-D additive mask (no patched modeling files). Each forward pass holds three parts:

* the uncached tokens of the context (at least the current token c, at position p);
* the *lookahead branch*: a window of W columns x L levels (L grows to N-1) of guessed tokens. Token (l, j)
  sits at position p+1+j+l and attends to the context, to level 0 at columns <= j and to its own column at
  levels <= l - so its view is the contiguous guessed sequence level0[0..j], level1..l[j]. The prediction at
  the last level of column j is a fresh Jacobi guess, and the column read top to bottom plus that guess is
  an N-gram whose every token was predicted from the ones before it: it goes into the pool keyed by its
  first token. The window then moves: levels shift up, the guesses become the last level, and when the
  step committed more than one token the leading columns (now behind the context) are dropped and fresh
  columns (tokens drawn from the context) appended, so every guess keeps pointing at its own position;
* the *verification branch*: up to G pool n-grams starting with c, each a causal chain at p+1, p+2, ...
  that sees only the context and itself. The target's predictions verify all of them at once; the longest
  accepted prefix (greedy rule, or the coupled rule with the request's u stream when sampling) plus the
  target's next token is committed - output == `ar` token for token, greedy or sampled.

The cache is cropped back to the context after every pass, so only committed tokens remain; the tokens
accepted from a candidate are fed (and cached) at the start of the next pass. Under sampling the Jacobi
guesses use the same u values the target will use at their positions, so they converge to the sampled text.
With `context_pool` the pool is also fed the N-grams of the prompt and of the output (as in the reference
implementation's prompt pool). At most N tokens are committed per pass (N-1 accepted + the target's own).

Step fields: `drafted` counts every candidate token verified in the pass (all G candidates), `accepted` the
tokens accepted from the best one, so acceptance = accepted / drafted is per verified token.
"""
from __future__ import annotations

import functools
import random

import torch

from .. import verification
from .base import Param, Run, Strategy, register

POOL_PER_KEY = 16


class NgramPool:
    """N-grams keyed by their first token; each key keeps its most recent distinct continuations first."""

    def __init__(self, cap: int = POOL_PER_KEY):
        self.cap = cap
        self.table: dict[int, list[tuple[int, ...]]] = {}

    def add(self, gram) -> None:
        key, rest = int(gram[0]), tuple(int(t) for t in gram[1:])
        lst = self.table.setdefault(key, [])
        if rest in lst:
            lst.remove(rest)
        lst.insert(0, rest)
        del lst[self.cap:]

    def add_all(self, seq, n: int, start: int = 0) -> None:
        """Every n-gram of seq that begins at index >= start."""
        for i in range(max(0, start), len(seq) - n + 1):
            self.add(seq[i:i + n])

    def get(self, key: int, g: int) -> list[tuple[int, ...]]:
        return self.table.get(int(key), [])[:g]

    def __len__(self) -> int:
        return sum(map(len, self.table.values()))


@functools.lru_cache(maxsize=64)
def _tril(n: int) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool).tril()


@functools.lru_cache(maxsize=64)
def window_mask(W: int, L: int) -> torch.Tensor:
    """The (L*W, L*W) 'may attend' block of the lookahead window (level-major), built once per window shape:
    token (l, j) sees level 0 at columns <= j and its own column at levels 1..l. Read-only."""
    allowed = torch.zeros(L * W, L * W, dtype=torch.bool)
    for l in range(L):
        for j in range(W):
            r = l * W + j
            allowed[r, :j + 1] = True                                   # level 0, columns <= j
            allowed[r, [m * W + j for m in range(1, l + 1)]] = True     # own column, levels 1..l
    return allowed


def layout(pending: list[int], cached: int, levels: list[list[int]], cands: list[list[int]]):
    """Tokens, position ids and the (T, T) 'may attend' matrix of one lookahead pass (see the module doc).

    pending: uncached context tokens (the last is the current token), starting at position `cached`;
    levels: the lookahead window, level-major (may be empty); cands: candidate continuations of the current
    token. Returns (tokens, positions, allowed, index of the window's first token, index of each candidate).
    The static blocks (the window's, the causal triangles) are built once and copied in.
    """
    P = len(pending)
    pos = cached + P - 1                      # position of the current token
    toks, positions = list(pending), list(range(cached, cached + P))
    look_at = P
    W = len(levels[0]) if levels else 0
    for l, lv in enumerate(levels):
        toks += lv
        positions += [pos + 1 + j + l for j in range(W)]
    cand_at = []
    for c in cands:
        cand_at.append(len(toks))
        toks += c
        positions += [pos + 1 + i for i in range(len(c))]
    T = len(toks)
    allowed = torch.zeros(T, T, dtype=torch.bool)
    allowed[:, :P] = True
    allowed[:P, :P] = _tril(P)
    if levels:
        n = len(levels) * W
        allowed[look_at:look_at + n, look_at:look_at + n] = window_mask(W, len(levels))
    for c, at in zip(cands, cand_at):
        allowed[at:at + len(c), at:at + len(c)] = _tril(len(c))
    return toks, positions, allowed, look_at, cand_at


@register
class Lookahead(Strategy):
    name = "lookahead"
    title = "Lookahead decoding"
    lossless = True
    params = {
        "window": Param(5, int, 1, 32, help="W: columns of the Jacobi lookahead window"),
        "ngram": Param(3, int, 2, 8, help="N: n-gram size harvested and verified"),
        "candidates": Param(5, int, 1, 32, help="G: pool n-grams verified per pass"),
        "context_pool": Param(True, bool, help="also pool the n-grams of the prompt and the output"),
    }

    def steps(self, run: Run):
        engine, p, out, cache = run.engine, run.params, run.out, run.cache
        W, N, G = p["window"], p["ngram"], p["candidates"]
        sp, us = run.sampling, run.us
        seq = list(run.ids)
        rnd = random.Random(run.request.seed)
        filler = lambda: seq[rnd.randrange(len(seq))]   # noqa: E731 - a guess drawn from the context
        levels = [[filler() for _ in range(W)]]
        pool = NgramPool()
        if p["context_pool"]:
            pool.add_all(seq, N)
        prefill = True
        while True:
            cached = engine.cache_len(cache)
            pending = seq[cached:]
            cur = seq[-1]
            room = out.budget - len(out.ids) - 1     # proposals beyond this would be cut anyway
            cands, seen = [], set()
            for c in pool.get(cur, G) if room > 0 else []:
                c = c[:room]
                if c and c not in seen:
                    seen.add(c)
                    cands.append(list(c))
            look = room > 0
            L = len(levels)
            # ---- one pass: pending | lookahead window (level-major) | candidates
            P = len(pending)
            toks, positions, allowed, look_at, cand_at = layout(pending, cached, levels if look else [], cands)
            logits = engine.forward(toks, cache, positions, engine.tree_mask(cached, allowed), upcast=False)[0]
            engine.crop(cache, len(seq))

            # ---- verify the candidates (or take the target's own token) and read the Jacobi guesses: every row
            # this step needs is picked in one batched operation
            start = len(out.ids)
            rows, upos = verification.candidate_rows(P - 1, cand_at, cands, start)
            n_verify = len(rows)
            if look:
                last = look_at + (L - 1) * W
                # column j's last level predicts output index start + L + j: use that position's u
                rows += range(last, last + W)
                upos += range(start + L, start + L + W)
            picked = verification.picks(logits, rows, upos, sp, us)
            _, v = verification.longest(cands, picked[:n_verify])

            # ---- Jacobi update and n-gram harvest
            if look:
                guesses = picked[n_verify:]
                if L == N - 1:
                    for j in range(W):
                        pool.add([levels[l][j] for l in range(L)] + [guesses[j]])
                    levels, drop = levels[1:] + [guesses], len(v.tokens) - 1
                else:
                    levels, drop = levels + [guesses], len(v.tokens)
                if drop:
                    levels = [lv[drop:] + [filler() for _ in range(min(drop, W))] for lv in levels]
                    levels = [lv[-W:] for lv in levels]

            old_len = len(seq)
            seq += v.tokens
            if p["context_pool"]:
                pool.add_all(seq, N, start=old_len - N + 1)
            step = out.step(v.tokens, forward_passes=1, drafted=sum(map(len, cands)), prefill=prefill,
                            info={"candidates": len(cands)})
            step.accepted = min(v.accepted, len(step.token_ids))
            yield step
            if out.done:
                return
            prefill = False
