"""`pld`: prompt lookup decoding - drafts copied from the context, no draft model.

Each step looks for the most recent earlier occurrence of the last n tokens of prompt + output (n from
`max_ngram` down to 1) and proposes the `num_pred` tokens that followed it; one target pass verifies them
with the coupled rule (`verification.coupled`): greedy output equals `ar`, and sampled output equals `ar`
with the same seed token for token. Without a match the step is a plain one-token step.

The copy may run into its own proposals, LZ77-style: when the match ends close to the end of the context,
the continuation keeps following the same offset, so a repeating cycle shorter than `num_pred` still yields
`num_pred` proposals.
"""
from __future__ import annotations

from .. import verification
from .base import Param, Run, Strategy, register

LOOKUP_NGRAM = 3      # the longest suffix n-gram the strategies that add copies to their drafts match (pld's default)


def _copy(seq: list[int], src: int, num_pred: int) -> list[int]:
    """num_pred tokens copied from seq[src:], continuing into the copy itself when it reaches the end."""
    ext, L = list(seq[src:]), len(seq)
    while len(ext) < (L - src) + num_pred:
        ext.append(ext[len(ext) - (L - src)])
    return ext[L - src:]


def lookup(seq: list[int], max_ngram: int, num_pred: int, min_ngram: int = 1) -> list[int]:
    """Proposals for the continuation of `seq` by a plain scan (the reference for `ContextIndex`).
    [] when nothing matches."""
    L = len(seq)
    if num_pred <= 0:
        return []
    for n in range(min(max_ngram, L - 1), min_ngram - 1, -1):
        tail = seq[L - n:]
        for i in range(L - n - 1, -1, -1):          # most recent start i < L - n with seq[i:i+n] == tail
            if seq[i] == tail[0] and seq[i:i + n] == tail:
                return _copy(seq, i + n, num_pred)
    return []


class ContextIndex:
    """Incremental n-gram index of prompt + output: the same proposals as `lookup`, O(n) work per step.

    For each n it maps an n-gram to the end (i + n) of its most recent occurrence that is followed by at
    least one token, so a lookup never finds the suffix itself.
    """

    def __init__(self, max_ngram: int):
        self.max_ngram = max_ngram
        self.seq: list[int] = []
        self.last: list[dict] = [{} for _ in range(max_ngram + 1)]

    def extend(self, tokens) -> None:
        old = len(self.seq)
        self.seq.extend(int(t) for t in tokens)
        L = len(self.seq)
        for end in range(max(1, old), L):           # occurrences ending at `end`, followed by seq[end]
            for n in range(1, min(self.max_ngram, end) + 1):
                self.last[n][tuple(self.seq[end - n:end])] = end

    def propose(self, num_pred: int) -> list[int]:
        return self.match(num_pred)[0]

    def match(self, num_pred: int, tail=()) -> tuple[list[int], int]:
        """The proposals and the length n of the suffix n-gram they follow (([], 0) without a match). With `tail`
        (tokens not yet settled, e.g. drafts), the continuation of seq + tail: its suffix n-gram is looked up among
        the occurrences in seq (none in the tail itself), and the copy runs on into the tail."""
        seq = self.seq + [int(t) for t in tail] if len(tail) else self.seq
        L = len(seq)
        if num_pred <= 0:
            return [], 0
        for n in range(min(self.max_ngram, L - 1), 0, -1):
            end = self.last[n].get(tuple(seq[L - n:]))
            if end is not None:
                return _copy(seq, end, num_pred), n
        return [], 0


class CopyRate:
    """How often a copied token is accepted once the token before it was (or it is the first), per length of the
    n-gram whose earlier occurrence it was copied after; counts decayed by `decay` a step, starting at one hit in
    two tries. The copy's j-th token (from 0) is then estimated accepted with its predecessors at rate ** (j + 1)."""

    def __init__(self, decay: float = 0.8):
        self.decay = decay
        self.hits: dict[int, float] = {}
        self.tries: dict[int, float] = {}

    def rate(self, n: int) -> float:
        return self.hits.get(n, 1.0) / self.tries.get(n, 2.0)

    def probs(self, n: int, length: int) -> list[float]:
        r = self.rate(n)
        return [r ** (j + 1) for j in range(length)]

    def record(self, n: int, tries: int, hits: int) -> None:
        """A step verified `tries` copied tokens (after n-gram length n) whose predecessors held; `hits` held."""
        if tries:
            self.hits[n] = self.decay * self.hits.get(n, 1.0) + hits
            self.tries[n] = self.decay * self.tries.get(n, 2.0) + tries


@register
class PromptLookup(Strategy):
    name = "pld"
    title = "Prompt lookup"
    lossless = True
    params = {
        "max_ngram": Param(LOOKUP_NGRAM, int, 1, 8, help="longest suffix n-gram looked up (then shorter ones)"),
        "num_pred": Param(10, int, 1, 64, help="tokens proposed after a match"),
    }

    def steps(self, run: Run):
        engine, p, out, cache = run.engine, run.params, run.out, run.cache
        sp, us = run.sampling, run.us
        seq = list(run.ids)
        index = ContextIndex(p["max_ngram"])
        index.extend(seq)
        prefill = True
        while True:
            room = out.budget - len(out.ids) - 1          # the last budget token comes free
            proposals = index.propose(min(p["num_pred"], room))
            base, k = len(seq), len(proposals)
            logits = engine.forward(seq[engine.cache_len(cache):] + proposals, cache, logits_to_keep=k + 1,
                                    upcast=False)[0]
            v = verification.coupled(proposals, logits, sp, us, start=len(out.ids))
            engine.crop(cache, base + v.accepted)
            seq += v.tokens
            index.extend(v.tokens)
            step = out.step(v.tokens, forward_passes=1, drafted=k, prefill=prefill)
            step.accepted = min(v.accepted, len(step.token_ids))
            yield step
            if out.done:
                return
            prefill = False
