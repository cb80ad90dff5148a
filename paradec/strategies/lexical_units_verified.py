"""`lud-verified`: Lexical Unit Decoding's pad slots as drafts that the next pass verifies. Lossless.

`lud` (lexical_units.py) emits the pad slots' confident predictions outright, so a wrong one changes the text.
But the next pass feeds those tokens as real inputs anyway (a token needs real KV entries before later ones can
attend to it), and the base model's logits on those real rows say which token `ar` would have picked at each of
them. Here the pad predictions are drafts, checked there at no extra pass:

    [x0, d1 .. dm] + [k-1 pad slots]      x0: the last settled token (not cached); d: the last step's drafts

On the real rows (the adapter is gated to the pad slots: they are the base model's own) the base picks c_j after
x0, d1 .. dj (j = 0 .. m) exactly as `ar` picks output token i: argmax when greedy, the request's u stream (u_i)
when sampling. d_{j+1} is accepted while it equals c_j; the step emits d1 .. dj and then c_j, so the output is
`ar`'s token for token, greedy and sampled with the same seed. When every draft was accepted, the pad slots'
predictions (read after x0 .. dm, and predicting the tokens after c_m) that pass `lud`'s rule - top class not STOP,
probability above `threshold`, in order - become the next step's drafts; after a refused draft they were read on a
wrong prefix and are dropped (the next pass has no drafts). The cache is cropped back to x0, d1 .. dj.

`threshold` here trades no quality: it only decides how many drafts the next pass carries, each one a row of that
pass. Its default, 0.3, from the held-out replay of the default model's parameters (`evals/lud_heldout.py`,
docs/bench/lud-verified-heldout-zen1.md: on held-out training prompts, not the suites): 1.28 tokens per pass at
k=2 and 1.34-1.35 at k=3-5, as many as threshold 0 with fewer refused drafts; 0.5 gives 1.27 and 1.32-1.33. With
the parameters of session 35 (alpha 0.5; docs/bench/lud-s35-heldout-amx.md) 0.3 still gives threshold 0's 1.74 at
k=5, and decoding held-out training prompts on an AMX Xeon it ran at 1.48x `ar` against 1.45x at 0.5
(docs/bench/lud-s35-tune-amx.md).

`layout` "branch" (a pass's tree): a group of pad slots follows every prefix x0, d1 .. dj (j = 0 .. m), each group
seeing only its own prefix (a tree mask; positions as if it followed dj), so whichever draft is refused, the pads
read after the accepted ones give the next pass its drafts - they predict the tokens after c_j, the base's own pick.
It costs (m+1)(k-1) pad rows instead of k-1. Held-out replay (bfloat16, k=5, threshold 0.3): 1.34 -> 1.44 tokens
per pass; but on 16 held-out training prompts on an AMX Xeon in bfloat16 the chain at k=5 ran at 1.07x `ar`, the
branch at 1.05x (k=5) and 1.08x (k=3), within one run's noise (docs/bench/lud-verified-amx.md): the LoRA hooks on
the pad rows cost ~14 ms of a ~63 ms pass there whatever their number. With session 35's parameters and the native
LoRA kernel (paradec/native.py) the branch gives 2.01 tokens per pass to the chain's 1.74 (held-out replay, k=5), but
decoding ran at 1.51x (branch, k=3) and 1.42x (branch, k=5) against the chain's 1.48x (k=5; one run,
docs/bench/lud-s35-tune-amx.md). With session 36's (700 steps) and the deltas added by the lean pass: chain 1.62x,
branch 1.60x (k=3) and 1.53x (k=5) (docs/bench/lud-s36-tune-amx.md). So the chain stays the default.
Step figures: forward_passes 1, drafted = drafts verified this pass, accepted = those accepted.
"""
from __future__ import annotations

import torch

from ..sampling import next_tokens
from .base import Param, Run, register
from .lexical_units import LexicalUnits, auto_k


@register
class VerifiedLexicalUnits(LexicalUnits):
    name = "lud-verified"
    title = "Lexical Unit Decoding, drafts verified (lossless)"
    lossless = True
    params = {
        "k": LexicalUnits.params["k"],
        "threshold": Param(0.3, float, 0.0, 1.0, "draft a pad prediction when its probability exceeds this (the "
                                                 "next pass verifies it; 1.0 = never: ar with pad slots)"),
        "layout": Param("chain", str, choices=("chain", "branch"),
                        help="pad slots after the drafts only (chain) or after every prefix of them (branch: a refused "
                             "draft still leaves the next pass drafts, at (drafts + 1) x the pad rows)"),
        "adapter": LexicalUnits.params["adapter"],
    }

    def steps(self, run: Run):
        engine, p, out, cache = run.engine, run.params, run.out, run.cache
        adapter = self.attach(run)
        threshold, k = p["threshold"], auto_k(engine, adapter, p["k"])
        branch = p["layout"] == "branch"
        sp, us = run.sampling, run.us
        feed, drafts = list(run.ids), []           # feed: settled tokens not yet cached; drafts: to verify
        prefill = True
        while True:
            m = len(drafts)
            left = out.budget - len(out.ids)
            cached = engine.cache_len(cache)
            F = len(feed)
            # pad groups: after the prefix ending at draft j (j = 0 .. m; only j = m in the chain layout); a group's
            # drafts fit the budget if they and the j tokens before them are all accepted
            groups = [(j, max(0, min(k - 1, left - j - 2))) for j in (range(m + 1) if branch else (m,))]
            groups = [(j, n) for j, n in groups if n]
            tokens = feed + drafts
            for _j, n in groups:
                tokens = tokens + [engine.pad_id] * n
            gate = torch.zeros(len(tokens), dtype=torch.bool)
            gate[F + m:] = True
            keep = len(tokens) - F + 1
            with adapter.gated(gate):
                if branch and m:
                    positions, allowed = branch_layout(cached, F, m, groups)
                    logits = engine.forward(tokens, cache, positions, engine.tree_mask(cached, allowed),
                                            logits_to_keep=keep, upcast=False)[0]
                else:
                    logits = engine.forward(tokens, cache, logits_to_keep=keep, upcast=False)[0]
            V = logits.shape[-1] - 1            # the applied adapter adds column V: its STOP class
            new = []
            for j in range(m + 1):
                i = len(out.ids) + j
                c = int(next_tokens(logits[j, :V], sp, us[i] if us else None))
                new.append(c)
                if j == m or drafts[j] != c:
                    break
            accepted = len(new) - 1
            nxt, at = [], m + 1
            for j, n in groups:                 # the group read after the accepted prefix, if there is one
                if j == accepted:
                    probs = torch.softmax(logits[at:at + n].float(), -1)
                    conf, top = probs.max(-1)
                    for cf, t in zip(conf.tolist(), top.tolist()):
                        if cf <= threshold or t == V:
                            break
                        nxt.append(t)
                at += n
            engine.crop(cache, cached + F + accepted)
            step = out.step(new, forward_passes=1, drafted=m, accepted=accepted, prefill=prefill)
            yield step
            if out.done:
                return
            prefill = False
            feed, drafts = [new[-1]], nxt


def branch_layout(cached: int, feed: int, m: int, groups: list[tuple[int, int]]):
    """Positions (1, T) and the (T, T) 'may attend' of a branch pass: `feed` settled tokens and m drafts causally,
    then for each (j, n) in `groups` n pad slots that see the feed, the drafts up to j and the group's earlier
    slots, at the positions after draft j."""
    R = feed + m
    T = R + sum(n for _j, n in groups)
    allowed = torch.zeros(T, T, dtype=torch.bool)
    allowed[:R, :R] = torch.ones(R, R, dtype=torch.bool).tril()
    positions = list(range(cached, cached + R))
    at = R
    for j, n in groups:
        last = feed + j                   # rows 0 .. last - 1: the feed and drafts 1 .. j
        allowed[at:at + n, :last] = True
        allowed[at:at + n, at:at + n] = torch.ones(n, n, dtype=torch.bool).tril()
        positions += range(cached + last, cached + last + n)
        at += n
    return torch.tensor([positions]), allowed
