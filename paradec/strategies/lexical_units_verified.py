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
k=2 and 1.34-1.35 at k=3-5, as many as threshold 0 with fewer refused drafts; 0.5 gives 1.27 and 1.32-1.33.
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
        "adapter": LexicalUnits.params["adapter"],
    }

    def steps(self, run: Run):
        engine, p, out, cache = run.engine, run.params, run.out, run.cache
        adapter = self.attach(run)
        threshold, k = p["threshold"], auto_k(engine, adapter, p["k"])
        sp, us = run.sampling, run.us
        feed, drafts = list(run.ids), []           # feed: settled tokens not yet cached; drafts: to verify
        prefill = True
        while True:
            m = len(drafts)
            left = out.budget - len(out.ids)
            n_pad = max(0, min(k - 1, left - m - 2))  # the next step's drafts fit the budget if all are accepted
            cached = engine.cache_len(cache)
            tokens = feed + drafts + [engine.pad_id] * n_pad
            gate = torch.zeros(len(tokens), dtype=torch.bool)
            gate[len(feed) + m:] = True
            with adapter.gated(gate):
                logits = engine.forward(tokens, cache, logits_to_keep=m + 1 + n_pad, upcast=False)[0]
            V = logits.shape[-1] - 1            # the applied adapter adds column V: its STOP class
            new = []
            for j in range(m + 1):
                i = len(out.ids) + j
                c = int(next_tokens(logits[j, :V], sp, us[i] if us else None))
                new.append(c)
                if j == m or drafts[j] != c:
                    break
            accepted = len(new) - 1
            nxt = []
            if accepted == m and n_pad:
                probs = torch.softmax(logits[m + 1:].float(), -1)
                conf, top = probs.max(-1)
                for cf, t in zip(conf.tolist(), top.tolist()):
                    if cf <= threshold or t == V:
                        break
                    nxt.append(t)
            engine.crop(cache, cached + len(feed) + accepted)
            step = out.step(new, forward_passes=1, drafted=m, accepted=accepted, prefill=prefill)
            yield step
            if out.done:
                return
            prefill = False
            feed, drafts = [new[-1]], nxt
