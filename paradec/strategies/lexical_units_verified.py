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
`lookup` (chain only; the branch layout takes no copies): after the pad drafts the pass also carries tokens copied from
the context - what `pld` would propose for the text the pad drafts lead to (the last 1-3 tokens of prompt + output + pad
drafts matched at their most recent earlier occurrence, the tokens after it copied; `ContextIndex.match`) - and a pass
may leave out its pad slots. `Copier` chooses both each step by expected tokens per second of the pass: the pass costs
measured once per engine and adapter (`passcost`: gated on the pad slots, and with the gate shut), the copy's acceptance
estimated from this run's own copies (`CopyRate`, per n-gram length), the pad drafts' from their confidences, and the
pad slots credited with what their drafts have been worth to the following step in this run. Where a copy is long and
likely, a pass without pad slots (pld's, at a plain pass's cost: the lean pass with the gate shut adds nothing) takes
it. Copies are drafts like the pads': verified on real rows, so the output stays `ar`'s; after a refused draft the next
pass has no pad drafts but may still carry a copy. Its default, 16, from held-out training prompts on an AMX Xeon in
bfloat16 (never the suites): 27 prompts of every kind 1.56x `ar` without, 1.64x with (docs/bench/lud-lookup-tune-amx.md;
`pld` 1.34x); 16 of the kinds conversation, lists, summarize, translate 1.15x -> 1.20x at the same 1.41 tokens per pass
(the pad slots left out where they did not pay; 32 the same: docs/bench/lud-lookup-tune-nl-amx.md); 15 of code-edit,
qa-context, summarize 1.40x -> 1.47-1.48x (`pld` 1.46x) with the first version of the rule, which always kept the pad
slots (docs/bench/lud-lookup-tune-copy-amx.md). With copies, k 5 stays: 1.62x against 1.61x (k 4) and 1.58x (k 3) on 27
other held-out prompts (docs/bench/lud-lookup-k-amx.md).
Step figures: forward_passes 1, drafted = drafts verified this pass, accepted = those accepted; with `lookup`
info["copied"] = how many of the drafts were copies (the last ones), info["pads"] = whether the pass had pad slots.
"""
from __future__ import annotations

import torch

from .. import passcost
from ..sampling import next_tokens
from .base import Param, Run, register
from ..lud import AdapterError, LUDAdapter
from .lexical_units import LexicalUnits, auto_k
from .prompt_lookup import LOOKUP_NGRAM, ContextIndex, CopyRate

COST_WIDTHS = (1, 2, 4, 8, 12, 16, 24, 32)     # pass widths timed once per engine for the `lookup` cut


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
        "lookup": Param(16, int, 0, 32, "chain (the branch layout ignores it): after the pad drafts also draft up "
                                        "to this many tokens copied from the context (what pld proposes for the text "
                                        "they lead to), as many as pay by the measured pass costs, and leave out pad "
                                        "slots where they do not pay (0 = off: pad drafts only, pad slots in every "
                                        "pass)"),
        "adapter": LexicalUnits.params["adapter"],
    }

    def steps(self, run: Run):
        engine, p, out, cache = run.engine, run.params, run.out, run.cache
        adapter = self.attach(run)
        threshold, k = p["threshold"], auto_k(engine, adapter, p["k"])
        branch = p["layout"] == "branch"
        sp, us = run.sampling, run.us
        feed, drafts = list(run.ids), []           # feed: settled tokens not yet cached; drafts: to verify
        copier = Copier(engine, adapter, k, run.ids, p["lookup"]) if p["lookup"] and not branch else None
        copied = ngram = 0                         # the last `copied` drafts are copies (after an n-gram of ngram)
        pads = True                                # whether this pass carries pad slots (always, without lookup)
        prefill = True
        while True:
            m = len(drafts)
            left = out.budget - len(out.ids)
            cached = engine.cache_len(cache)
            F = len(feed)
            # pad groups: after the prefix ending at draft j (j = 0 .. m; only j = m in the chain layout); a group's
            # drafts fit the budget if they and the j tokens before them are all accepted
            groups = [(j, max(0, min(k - 1, left - j - 2))) for j in (range(m + 1) if branch else (m,))]
            groups = [(j, n) for j, n in groups if n and pads]
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
            nxt, confs, at = [], [], m + 1
            for j, n in groups:                 # the group read after the accepted prefix, if there is one
                if j == accepted:
                    probs = torch.softmax(logits[at:at + n].float(), -1)
                    conf, top = probs.max(-1)
                    for cf, t in zip(conf.tolist(), top.tolist()):
                        if cf <= threshold or t == V:
                            break
                        nxt.append(t)
                        confs.append(cf)
                at += n
            engine.crop(cache, cached + F + accepted)
            step = out.step(new, forward_passes=1, drafted=m, accepted=accepted, prefill=prefill,
                            info={"copied": copied, "pads": bool(groups)} if copier is not None else {})
            yield step
            if out.done:
                return
            prefill = False
            feed, drafts = [new[-1]], nxt
            if copier is not None:
                copier.settled(new, m - copied, copied, ngram, accepted, bool(groups))
                copy, ngram, pads = copier.propose(nxt, confs, out.budget - len(out.ids))
                drafts, copied = nxt + copy, len(copy)


def preload(engine) -> None:
    """Measure the pass costs `lookup` reads for the engine's default LUD parameters now (about 4 s for the default
    model on a 2-core CPU), before any request thread: else the first request pays them."""
    try:
        ad = LUDAdapter.find(engine)
    except AdapterError:
        return
    if ad is None:
        return
    with ad.attached(engine.model):
        Copier(engine, ad, auto_k(engine, ad, 0), [], 1)


class Copier:
    """`lookup`: tokens copied from the context (pld's proposal) as drafts after the pad drafts, and whether the
    pass carries pad slots. Of the copy, the first j tokens are kept, with or without pad slots, for the choice that
    maximises the step's expected tokens per second of its pass: expected tokens 1 + the pad drafts' cumulative
    confidences + their product x the copy's estimated acceptance (`CopyRate`), plus - with pad slots - what pad
    drafts have been worth to the step after (this run's decayed mean of accepted pad drafts) times the chance that
    every draft holds (pads read after a refused draft are dropped); seconds: the pass costs measured once per
    engine and adapter (`passcost`), gated on the pad slots or with the gate shut. Where a copy is long and likely
    a pass without pad slots (pld's) is the cheaper way to take it. (Tried and dropped: offering instead the copy of
    the settled context alone, without the pad drafts, where it counted more: on 15 held-out training prompts of the
    copy-heavy kinds, two runs each, 1.58-1.61x `ar` with it against 1.64-1.68x without.)"""

    def __init__(self, engine, adapter, k: int, ids, most: int):
        self.most, self.k = most, k
        self.index = ContextIndex(LOOKUP_NGRAM)
        self.index.extend(ids)
        self.rates = CopyRate()
        self.pad_hits, self.pad_steps = 1.0, 2.0         # accepted pad drafts per step they could come in
        self.after_pads = False                          # this step's pad drafts came from pads read last pass
        tail = lambda n: lambda w: adapter.gated(torch.arange(w) >= w - min(n, w - 1))   # noqa: E731
        key = f"lud-{id(adapter)}"
        self.costs = passcost.pass_costs(engine, COST_WIDTHS, key=f"{key}-shut", gate=tail(0))
        self.gated = passcost.pass_costs(engine, COST_WIDTHS, key=f"{key}-k{k}", gate=tail(k - 1))

    def settled(self, new, pads: int, copied: int, ngram: int, accepted: int, had_pads: bool) -> None:
        """After a step: `new` joined the context; of its drafts, `pads` pad drafts then `copied` copies, of which
        `accepted` (in all) were accepted; `had_pads`: the pass carried pad slots. A copy token counts as tried
        when every draft before it held."""
        self.index.extend(new)
        if copied and accepted >= pads:
            self.rates.record(ngram, min(copied, accepted - pads + 1), accepted - pads)
        if self.after_pads:
            self.pad_hits = self.rates.decay * self.pad_hits + min(pads, accepted)
            self.pad_steps = self.rates.decay * self.pad_steps + 1
        self.after_pads = had_pads and accepted == pads + copied

    def propose(self, drafts: list[int], confs: list[float], left: int) -> tuple[list[int], int, bool]:
        """The copied tokens to draft after `drafts` (pad drafts with confidences `confs`) when `left` tokens of
        the budget remain, the n-gram length they were copied after, and whether the pass carries pad slots."""
        room = min(self.most, left - 1 - len(drafts))
        copy, ngram = self.index.match(room, tail=drafts) if room > 0 else ([], 0)
        reach, expected = 1.0, 1.0
        for c in confs:
            reach *= c
            expected += reach
        later = self.pad_hits / self.pad_steps
        best, choice = None, (0, True)
        for j, q in enumerate([1.0] + self.rates.probs(ngram, len(copy))):
            held = reach * q                            # every draft holds
            expected += 0.0 if j == 0 else held
            m = len(drafts) + j
            n = max(0, min(self.k - 1, left - m - 2))
            options = [(expected / passcost.cost_at(self.costs, 1 + m), False)]
            if n:
                options.append(((expected + later * held) / passcost.cost_at(self.gated, 1 + m + n), True))
            for value, pads in options:
                if best is None or value > best:
                    best, choice = value, (j, pads)
        j, pads = choice
        return copy[:j], (ngram if copy else 0), pads


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
