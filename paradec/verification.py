"""Verification of drafted tokens: the one place a strategy decides which proposals the target keeps.

Every rule takes the drafted tokens d_1..d_k and the target's logits at the k+1 positions that predict
them (row i predicts the token after d_1..d_i; row 0 predicts d_1, row k the bonus token) and returns a
`Verdict`: the accepted prefix of the draft followed by exactly one token from the target - its own token at
the first mismatch, or a bonus token when every draft token was accepted. A step therefore always gains at
least one token, and the output is the target's:

* `greedy`     - accept while d_i equals the target's argmax (longest matching prefix).
* `coupled`    - accept while d_i equals Pick(u_i, p_i), with u_i the request's uniform for that output
                 position (`sampling.UStream`). The target would have sampled exactly Pick(u_i, p_i) itself,
                 so the output is token for token what `ar` produces with the same seed. Under greedy
                 decoding Pick is the argmax, so this *is* the greedy rule.
* `rejection`  - Leviathan et al. / Chen et al. 2023 speculative sampling for a draft model that sampled
                 d_i from its own processed distribution q_i: accept d_i with probability
                 min(1, p_i(d_i) / q_i(d_i)); at the first rejection sample from normalize(max(p_i - q_i, 0));
                 if all are accepted sample the bonus token from p_{k+1}. The output is distributed exactly
                 as the target's samples (not token-for-token equal to `ar`; it uses its own random stream,
                 `Rng`, seeded from the request's seed).

`tree` verifies a tree of proposals (eagle's tree drafts): at each accepted node its children are tried in order
(greedy: the child equal to the target's argmax; sampling: child x accepted with probability r(x) / sum(r), r
the target's processed distribution with the children already refused set to 0, then a draw from r when none
is; that is exactly a draw from p, so the output is distributed as the target's whatever the draft proposed).

`longest` verifies several candidate continuations of one context (lookahead's pool n-grams) by the coupled
rule. A step's rows are chosen first and picked together (`picks`: one batched pick, one read-back), whatever
the number of candidates; logits may be in the model's dtype (only the chosen rows are upcast).

Processed distributions (temperature, top-k, top-p) always come from `sampling.process`, for the target
and the draft alike.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling import SamplingParams, UStream, argmax, next_tokens, pick, process

# Mixed into the request seed so the rejection-sampling stream is not the UStream of the same seed.
_RNG_SALT = 0x5EED_5A3B


@dataclass
class Verdict:
    tokens: list[int]      # accepted draft tokens, then one target token (correction or bonus)
    accepted: int          # how many draft tokens were accepted (tokens has accepted + 1 entries)


class Rng:
    """The seeded random stream of rejection sampling (draft sampling, accept tests, residual draws)."""

    def __init__(self, seed: int):
        self.gen = torch.Generator().manual_seed((int(seed) ^ _RNG_SALT) % (2**63 - 1))

    def uniform(self) -> float:
        return float(torch.rand((), generator=self.gen, dtype=torch.float64))

    def sample(self, probs: torch.Tensor) -> int:
        """One token from a (V,) distribution, by inverse CDF."""
        return int(pick(probs, self.uniform()))


def _rows(logits: torch.Tensor, k: int) -> torch.Tensor:
    logits = logits.reshape(-1, logits.shape[-1])
    if logits.shape[0] != k + 1:
        raise ValueError(f"verification needs k+1 = {k + 1} rows of logits, got {logits.shape[0]}")
    return logits


def target_tokens(logits: torch.Tensor, sp: SamplingParams, us: UStream | None, start: int) -> list[int]:
    """The tokens the target itself picks at each row: row i uses u_{start+i} (argmax when greedy)."""
    return _picked(logits, sp, None if sp.greedy or us is None else us.span(start, logits.shape[0]))


def picks(logits: torch.Tensor, rows, positions, sp: SamplingParams, us: UStream | None) -> list[int]:
    """The target's own token at each of `rows` of `logits` (T, V), row rows[i] with the u of output position
    positions[i] (argmax when greedy): the rows are chosen first (so a model-dtype pass is upcast only there),
    then picked in one batched operation and read back in one transfer."""
    rows = list(rows)
    sel = logits[torch.tensor(rows, dtype=torch.long, device=logits.device)]
    u = None if sp.greedy or us is None else torch.tensor([us[i] for i in positions], dtype=torch.float64)
    return _picked(sel, sp, u)


def _picked(rows: torch.Tensor, sp: SamplingParams, u: torch.Tensor | None) -> list[int]:
    if u is None:
        return argmax(rows).tolist()
    return next_tokens(rows, sp, u).tolist()


def greedy(draft: list[int], logits: torch.Tensor) -> Verdict:
    """Longest prefix of `draft` equal to the target's argmax, then the target's argmax at the next row."""
    logits = _rows(logits, len(draft))
    return _prefix(draft, argmax(logits).tolist())


def coupled(draft: list[int], logits: torch.Tensor, sp: SamplingParams, us: UStream | None, start: int) -> Verdict:
    """Accept d_i while d_i == Pick(u_{start+i}, p_i); `start` is the output index of d_1. Greedy when sp is."""
    logits = _rows(logits, len(draft))
    return _prefix(draft, target_tokens(logits, sp, us, start))


def _prefix(draft: list[int], target: list[int]) -> Verdict:
    n = 0
    while n < len(draft) and int(draft[n]) == int(target[n]):
        n += 1
    return Verdict([int(t) for t in draft[:n]] + [int(target[n])], n)


def candidate_rows(first: int, at: list[int], candidates: list[list[int]], start: int
                   ) -> tuple[list[int], list[int]]:
    """(rows, output positions) whose target tokens verify several candidate continuations of one context at
    once: `first` is the row predicting every candidate's first token (output position `start`), and candidate
    c's token i sits at row at[c] + i and predicts position start + 1 + i. Pick them with `picks`, then `longest`."""
    rows, positions = [first], [start]
    for c, a in zip(candidates, at):
        rows += range(a, a + len(c))
        positions += range(start + 1, start + 1 + len(c))
    return rows, positions


def longest(candidates: list[list[int]], targets: list[int]) -> tuple[int, Verdict]:
    """Verify several candidate continuations of the same context; keep the one with the most accepted tokens.

    targets: the target's tokens at `candidate_rows` (the shared first row, then every candidate's rows in
    order), all picked in one batched `picks`. Each candidate is checked with the coupled rule against its own
    rows. Ties go to the earlier candidate. Returns (index, verdict). With no candidates the verdict is the
    target's own next token (index -1).
    """
    best, best_v, at = -1, _prefix([], targets[:1]), 1
    for c, cand in enumerate(candidates):
        v = _prefix(cand, targets[:1] + targets[at:at + len(cand)])
        at += len(cand)
        if best < 0 or v.accepted > best_v.accepted:
            best, best_v = c, v
    return best, best_v


def rejection(draft: list[int], draft_probs: torch.Tensor, logits: torch.Tensor, sp: SamplingParams,
              rng: Rng) -> Verdict:
    """Speculative (rejection) sampling. draft_probs (k, V): the processed draft distributions q_i the draft
    tokens were sampled from; logits (k+1, V): the target's raw logits. Greedy requests use the greedy rule."""
    logits = _rows(logits, len(draft))
    if sp.greedy:
        return greedy(draft, logits)
    p = process(logits, sp)
    q = draft_probs.reshape(-1, p.shape[-1]).to(p.device, torch.float32)
    k = len(draft)
    if k:       # p_i(d_i) and q_i(d_i) of every draft token, read back in one transfer
        ar, d = torch.arange(k, device=p.device), torch.tensor([int(t) for t in draft], device=p.device)
        px, qx = torch.stack([p[ar, d], q[ar, d]]).tolist()
    for i in range(k):
        if qx[i] > 0 and rng.uniform() < min(1.0, px[i] / qx[i]):
            continue
        residual = (p[i] - q[i]).clamp_min(0)
        # p == q up to rounding: the residual is undefined, p is exact (chosen on the device: no read-back)
        residual = torch.where(residual.sum() > 0, residual, p[i])
        return Verdict([int(t) for t in draft[:i]] + [rng.sample(residual)], i)
    return Verdict([int(t) for t in draft] + [rng.sample(p[len(draft)])], len(draft))


def draft_verdict(proposals: list[int], qs: list[torch.Tensor], logits: torch.Tensor, sp: SamplingParams,
                  rng: Rng) -> Verdict:
    """A draft model's proposals checked by the target: `greedy` for greedy requests, else `rejection` with the
    draft's processed distributions `qs` (one per proposal; none for a plain step)."""
    if sp.greedy:
        return greedy(proposals, logits)
    qprobs = torch.stack(qs) if qs else logits.new_zeros((0, logits.shape[-1]))
    return rejection(proposals, qprobs, logits, sp, rng)


def draft_pick(logits: torch.Tensor, sp: SamplingParams, rng: Rng, qs: list[torch.Tensor]) -> int:
    """The draft's proposal from its logits: the argmax when greedy, else a sample from its processed
    distribution, which is appended to `qs` for `draft_verdict`."""
    if sp.greedy:
        return int(argmax(logits))
    q = process(logits, sp)
    qs.append(q)
    return rng.sample(q)


def tree(tokens: list[int], parents: list[int], logits: torch.Tensor, sp: SamplingParams, rng: Rng
         ) -> tuple[Verdict, list[int]]:
    """Verify a tree of proposals. Node i holds token tokens[i] and hangs under node parents[i] (-1: the root, the
    context's last token; every parent comes before its children, and a node's children are tried in index
    order). logits (n + 1, V): row 0 the target's at the root, row 1 + i at node i. Returns the verdict (the
    accepted path's tokens, then the target's own token) and the accepted path's node indices."""
    n = len(tokens)
    rows = logits.reshape(-1, logits.shape[-1])
    if rows.shape[0] != n + 1 or len(parents) != n:
        raise ValueError(f"a tree of {n} nodes needs {n + 1} rows of logits, got {rows.shape[0]}")
    children: dict[int, list[int]] = {}
    for i, par in enumerate(parents):
        if not -1 <= par < i:
            raise ValueError(f"node {i}'s parent {par} does not come before it")
        children.setdefault(par, []).append(i)
    path, node = [], -1
    if sp.greedy:
        best = argmax(rows).tolist()         # every row's argmax, one read-back
        while True:
            t = best[node + 1]
            nxt = next((c for c in children.get(node, []) if int(tokens[c]) == t), None)
            if nxt is None:
                return Verdict([int(tokens[c]) for c in path] + [t], len(path)), path
            path.append(nxt)
            node = nxt
    while True:
        r = process(rows[node + 1:node + 2], sp)[0]
        nxt = None
        for c in children.get(node, []):
            tok = int(tokens[c])
            mass, px = r.sum().tolist(), float(r[tok])
            if px > 0 and rng.uniform() * mass < px:
                nxt = c
                break
            r = r.clone()
            r[tok] = 0
        if nxt is None:
            total = float(r.sum())
            r = r / total if total > 0 else process(rows[node + 1:node + 2], sp)[0]   # (rounding: all refused)
            return Verdict([int(tokens[c]) for c in path] + [rng.sample(r)], len(path)), path
        path.append(nxt)
        node = nxt

