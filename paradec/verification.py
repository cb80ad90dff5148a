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

Processed distributions (temperature, top-k, top-p) always come from `sampling.process`, for the target
and the draft alike.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling import SamplingParams, UStream, next_tokens, pick, process

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
    if sp.greedy or us is None:
        return logits.argmax(-1).tolist()
    return next_tokens(logits, sp, us.span(start, logits.shape[0])).tolist()


def greedy(draft: list[int], logits: torch.Tensor) -> Verdict:
    """Longest prefix of `draft` equal to the target's argmax, then the target's argmax at the next row."""
    logits = _rows(logits, len(draft))
    return _prefix(draft, logits.argmax(-1).tolist())


def coupled(draft: list[int], logits: torch.Tensor, sp: SamplingParams, us: UStream | None, start: int) -> Verdict:
    """Accept d_i while d_i == Pick(u_{start+i}, p_i); `start` is the output index of d_1. Greedy when sp is."""
    logits = _rows(logits, len(draft))
    return _prefix(draft, target_tokens(logits, sp, us, start))


def _prefix(draft: list[int], target: list[int]) -> Verdict:
    n = 0
    while n < len(draft) and int(draft[n]) == int(target[n]):
        n += 1
    return Verdict([int(t) for t in draft[:n]] + [int(target[n])], n)


def longest(candidates: list[list[int]], logits: list[torch.Tensor], sp: SamplingParams, us: UStream | None,
            start: int) -> tuple[int, Verdict]:
    """Verify several candidate continuations of the same context; keep the one with the most accepted tokens.

    logits[c] holds the k_c + 1 rows for candidate c (row 0, the prediction of the first token, is the same
    context for every candidate). Ties go to the earlier candidate. Returns (index, verdict). With nothing to
    verify pass one empty candidate and its single row: the verdict is then the target's own next token.
    """
    best, best_v = -1, None
    for c, (cand, lg) in enumerate(zip(candidates, logits)):
        v = coupled(cand, lg, sp, us, start)
        if best_v is None or v.accepted > best_v.accepted:
            best, best_v = c, v
    if best_v is None:
        raise ValueError("longest() needs at least one candidate (an empty one verifies a single token)")
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
    for i, x in enumerate(map(int, draft)):
        px, qx = float(p[i, x]), float(q[i, x])
        if qx > 0 and rng.uniform() < min(1.0, px / qx):
            continue
        residual = (p[i] - q[i]).clamp_min(0)
        if float(residual.sum()) <= 0:       # p == q up to rounding: the residual is undefined, p is exact
            residual = p[i]
        return Verdict([int(t) for t in draft[:i]] + [rng.sample(residual)], i)
    return Verdict([int(t) for t in draft] + [rng.sample(p[len(draft)])], len(draft))
