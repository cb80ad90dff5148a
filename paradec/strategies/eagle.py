"""`eagle`: speculative decoding with a feature-level draft (EAGLE, Li et al. 2024; paradec/feature_draft.py).

The draft is one decoder layer that reads the target's own final hidden states: each target pass leaves the
hidden state of every position it fed, and the draft, given the feature f_j and the token t_{j+1} that followed,
predicts f_{j+1} and so the token after. A step: the draft first reads the true features of the positions the
last target pass settled (one draft pass, usually a few positions wide) and proposes a token; each further
proposal reads the draft's own predicted feature (one draft pass each); then one target pass over the uncached
tokens plus the k proposals verifies them exactly as `sps` does (`verification.greedy`: longest prefix equal to
the target's argmax, so the output is `ar`'s; `verification.rejection` when sampling: distributed exactly as
the target's), and leaves the true features of what it accepted for the next step. The draft's cache keeps only
positions it read with true features. The first step is a plain target pass over the prompt (there are no
features before it). k follows the same cost rule as `sps` (`speculative.CostRule`): the running acceptance
rate against the target's measured pass costs and the draft's measured step cost; k may be 0 (a plain step).

Invariant between steps: `seq` is prompt + output; the target cache holds a prefix of `seq` (all but at least
its last token); `feats` holds the true features of positions dlen .. len(seq) - 2, the draft cache positions
0 .. dlen - 1.
"""
from __future__ import annotations

import threading
import time

import torch

from .. import feature_draft as FD
from .. import verification
from ..engine import Engine, ModelError
from ..sampling import argmax
from .base import Param, Run, Strategy, register
from .speculative import K_MAX, CostRule, draft_step

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
    """Load the engine's feature draft (when it has one) and time its step now, before any request thread."""
    try:
        step_cost(engine, feature_draft(engine))
    except NoFeatureDraft:
        pass


def step_cost(engine, fd: FD.FeatureDraft, repeats: int = 5) -> float:
    """Seconds of one draft step (one position after a short cached context, plus the head), the fastest of
    `repeats`; measured once per engine and draft."""
    memo = engine.extras.setdefault("eagle_cost", {})
    if id(fd) not in memo:
        hsz = int(engine.model.config.hidden_size)
        with torch.inference_mode():
            cache = fd.new_cache()
            fd.hidden(torch.zeros(1, 32, hsz, dtype=engine.dtype, device=engine.device),
                      torch.zeros(1, 32, dtype=torch.long), cache)
            best = float("inf")
            for _ in range(repeats):
                engine.sync()
                t = time.perf_counter()
                h = fd.hidden(torch.zeros(1, 1, hsz, dtype=engine.dtype, device=engine.device),
                              torch.zeros(1, 1, dtype=torch.long), cache)
                int(argmax(fd.logits(h[0, -1])))
                engine.sync()
                best = min(best, time.perf_counter() - t)
                cache.crop(-1)
        memo[id(fd)] = best
    return memo[id(fd)]


@register
class Eagle(Strategy):
    name = "eagle"
    title = "Speculative decoding (feature-level draft, EAGLE)"
    lossless = True
    params = {
        "k": Param(4, int, 1, K_MAX, help="tokens drafted per step (the start value when adaptive)"),
        "adaptive": Param(True, bool, help="choose k after every step by the cost rule (as sps's rule 'cost')"),
    }

    def available(self, engine) -> tuple[bool, str]:
        try:
            feature_draft(engine)
        except ModelError as e:
            return False, str(e)
        return True, ""

    def steps(self, run: Run):
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
            draft_seconds = time.perf_counter() - t0 if timed else None
            base, fed = len(seq), engine.cache_len(tcache)
            with FD.capture(engine) as got:
                logits = engine.forward(seq[fed:] + proposals, tcache, logits_to_keep=kk + 1, upcast=False)[0]
            v = verification.draft_verdict(proposals, qs, logits, sp, rng)
            engine.crop(tcache, base + v.accepted)
            Engine.crop(dcache, dlen)
            # true features of the positions settled now (fed .. base + accepted - 1) join the unread ones
            new = got[-1][:, :base + v.accepted - fed]
            feats = new if feats is None else torch.cat([feats[:, :fed - dlen], new], 1)
            seq += v.tokens
            yield draft_step(out, v, kk, prefill)
            if out.done:
                return
            prefill = False
            if rule is not None:
                k = rule.next_k(kk, v.accepted, draft_seconds)
