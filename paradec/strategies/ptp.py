"""`ptp`: Parallel Token Prediction (Draxler et al., arXiv 2512.21323) with fused verify-and-draft passes.

The model's PTP adapter (`paradec.ptp`) drafts tokens from auxiliary slots that carry the request's own
uniforms u (the UStream value of each output position; greedy requests feed them too - at temperature 0 the
argmax bin is all of [0, 1), so any u is right). Verification uses the same u's: a drafted token is correct
iff it equals Pick(u, base distribution) (`verification.coupled`), so the output is token for token `ar`'s,
greedy and sampled with the same seed.

Every step is ONE forward pass of the target weights (Partial Quadratic Decoding):

    [x0, d1 .. dm]  real tokens: x0 the last emitted token (not yet cached), d the drafts to verify
    branch j (for each chosen accepted count j in 0..m): m+1 auxiliary slots that assume x0, d1..dj are
                    accepted; slot 1 sits at dj's position, slot a continues at +a-1.

A 4-D mask lets the real tokens see the cache and each other causally, and each branch see the cache,
x0..dj and its own earlier slots. From the logits the base verifies d1..dm (rows of x0..dm): j accepted plus
the base's own token c at j+1. Branch j's slot 1 targets c (already known exactly); its slots 2..m+1 are the
next step's drafts. The cache is cropped back to x0..dj (the slots and rejected drafts leave it), c is the
next x0. When the accepted count has no branch (branches < m+1) the next step has no drafts (a fallback pass:
x0 plus one branch, 1 token). The first step is the prompt prefill plus one branch.

Branches: drafting a branch for every possible accepted count is the full quadratic layout (m+1 + (m+1)^2
positions per pass); `branches=B` keeps the B most likely counts, estimated from the drafter's own
probabilities of its drafts (P(j) ~ q1..qj (1 - q_{j+1})). Forward passes are counted honestly: one per step,
prefill included; there are no separate draft passes.
"""
from __future__ import annotations

import functools

import torch

from .. import ptp as P
from .. import verification
from ..sampling import UStream, argmax, pick, process
from .base import Param, Run, Strategy, register, trained_availability

# On a CPU a pass costs roughly in proportion to its positions, so the full quadratic layout (block 16: 272
# positions) loses to `ar`; these defaults keep a pass small. On a GPU a pass of a few hundred positions costs
# about what one token does, so there the defaults are the paper's: k = block - 1 and every branch.
# float32 on a CPU (AVX2, no bf16 matmuls): measured by evals/ptp_tune.py on held-out training prompts with the
# default model's adapter (docs/bench/ptp_tune.md): k=1/1 branch 1.41x ar, 2/1 1.25x, 3/1 1.02x, 4/2 0.47x.
# bf16 on a CPU with AMX (a 16-token pass ~1.1x one token, packed weights): docs/bench/ptp_tune_bf16.md, 6
# held-out prompts, the adapter of 2026-12-03 (540 steps): 3/2 1.54x ar (2.01 tokens/pass), 4/2 1.54x (2.08),
# 2/1 and 3/1 1.51x, 5/2 1.36x, 7/3 1.31x: 3/2.
# These constants are the fallback. When the adapter's folder holds a decoding profile (`PROFILE`, written by
# evals/ptp_tune.py --write-profile: tokens per pass and pass widths of each (k, branches) on held-out training
# prompts), a CPU request with k and branches on auto takes the configuration with the most tokens per second
# that the profile's tokens per pass and THIS machine's measured pass costs predict (`plan`): on an AMD EPYC
# without AMX a 12-position pass costs ~1.5 one-position passes, on the Xeon above ~1.1.
CPU_K, CPU_BRANCHES = 3, 2
CPU_FP32_K, CPU_FP32_BRANCHES = 1, 1
PROFILE = "decoding.json"
MIN_SHARE = 0.05         # pass widths under this share of a configuration's passes are not measured


def choose_branches(conf: list[float], budget: int) -> list[int]:
    """Accepted counts j in 0..m worth a branch, m = len(conf); conf[i] = drafter's probability of draft i+1.
    budget <= 0: all of them. Otherwise the `budget` likeliest under P(j) = q1..qj (1 - q_{j+1})."""
    m = len(conf)
    if budget <= 0 or budget >= m + 1:
        return list(range(m + 1))
    probs, run = [], 1.0
    for j in range(m + 1):
        nxt = conf[j] if j < m else 0.0
        probs.append(run * (1.0 - nxt))
        run *= nxt
    best = sorted(range(m + 1), key=lambda j: -probs[j])[:budget]
    return sorted(best)


def read_profile(ad) -> list[dict] | None:
    """The decoding profile beside a loaded adapter (its folder's `PROFILE`): the configurations it measured, each
    {"k", "branches", "tokens_per_pass", "widths": {positions: passes}} over decode passes; None when absent or
    unreadable (the constants then apply)."""
    import json
    folder = getattr(ad, "folder", None)
    if folder is None or not (folder / PROFILE).exists():
        return None
    try:
        configs = json.loads((folder / PROFILE).read_text())["configs"]
        return [c for c in configs if c["tokens_per_pass"] > 0 and c["widths"]] or None
    except (ValueError, KeyError, TypeError):
        return None


def kept_widths(config: dict) -> dict[int, int]:
    """{positions: passes} of a profile configuration, widths under MIN_SHARE of its passes left out."""
    widths = {int(w): n for w, n in config["widths"].items()}
    total = sum(widths.values())
    return {w: n for w, n in widths.items() if n >= MIN_SHARE * total} or widths


def pick_config(configs: list[dict], cost) -> dict:
    """The configuration with the most tokens per second predicted from its tokens per pass and `cost(width)`,
    the seconds of a pass over that many positions: tokens_per_pass / mean pass cost over its pass widths (widths
    under MIN_SHARE of its passes left out). Returns {"k", "branches", "tokens_per_pass", "pass_ms", "tok_s"}."""
    best = None
    for c in configs:
        kept = kept_widths(c)
        mean = sum(cost(w) * n for w, n in kept.items()) / sum(kept.values())
        row = {"k": int(c["k"]), "branches": int(c["branches"]), "tokens_per_pass": round(c["tokens_per_pass"], 3),
               "pass_ms": round(mean * 1000, 2), "tok_s": round(c["tokens_per_pass"] / mean, 2)}
        if best is None or row["tok_s"] > best["tok_s"]:
            best = row
    return best


def plan(engine, ad) -> dict | None:
    """(k, branches) for auto requests on this engine from the adapter's decoding profile and measured pass costs
    (paradec/passcost.py: the passes carry the adapter's hooks, gated on about two thirds of their positions, as
    ptp's are); chosen once per engine and adapter. None without a profile. The adapter must be attached."""
    from .. import passcost
    memo = engine.extras.setdefault("ptp_plans", {})
    if id(ad) in memo:
        return memo[id(ad)]
    configs = read_profile(ad)
    chosen = None
    if configs:
        configs = [c for c in configs if int(c["k"]) <= ad.block - 1] or configs
        widths = sorted({w for c in configs for w in kept_widths(c)})
        costs = passcost.pass_costs(engine, widths, key=f"ptp-{id(ad)}",
                                    gate=lambda w: ad.gated(max(1, w - max(1, w // 3))))
        chosen = pick_config(configs, lambda w: passcost.cost_at(costs, w))
        chosen["from"] = f"{PROFILE} and this machine's pass costs"
    memo[id(ad)] = chosen
    return chosen


def layout(n_real: int, m: int, branches: list[int], slots: int, device=None):
    """Masks and offsets of one fused pass over n_real real tokens (the last m+1 being x0, d1..dm) followed by
    len(branches) * slots auxiliary slots. Returns (allowed (T, T) bool, offsets (T,) position offsets from the
    first real token, aux index (n_aux,) sequence indices of the slots), on `device` (default: the CPU).
    A decode repeats a few shapes, so each is built once and shared: the tensors are read-only."""
    return _layout(n_real, m, tuple(branches), slots, torch.device(device or "cpu"))


@functools.lru_cache(maxsize=128)
def _layout(n_real: int, m: int, branches: tuple, slots: int, device: torch.device):
    T = n_real + len(branches) * slots
    allowed = torch.zeros(T, T, dtype=torch.bool)
    allowed[:n_real, :n_real] = torch.ones(n_real, n_real, dtype=torch.bool).tril()
    offsets = torch.zeros(T, dtype=torch.long)
    offsets[:n_real] = torch.arange(n_real)
    x0 = n_real - m - 1                       # sequence index of x0
    for b, j in enumerate(branches):
        s = n_real + b * slots
        allowed[s:s + slots, :x0 + j + 1] = True                              # context up to dj
        allowed[s:s + slots, s:s + slots] = torch.ones(slots, slots, dtype=torch.bool).tril()
        offsets[s:s + slots] = x0 + j + torch.arange(slots)                   # slot 1 at dj's position
    return allowed.to(device), offsets.to(device), torch.arange(n_real, T, device=device)


@register
class ParallelTokenPrediction(Strategy):
    name = "ptp"
    title = "Parallel Token Prediction (PTP)"
    lossless = True
    params = {
        "k": Param(0, int, 0, 64, help="drafts verified per pass (0: auto - the adapter's block - 1 on a GPU; on a "
                                       "CPU, with branches also auto, the adapter's decoding profile against this "
                                       f"machine's measured pass costs, else {CPU_K} on a bf16 CPU, {CPU_FP32_K} on "
                                       "a float32 CPU)"),
        "branches": Param(0, int, 0, 65, help="accepted counts drafted ahead per pass (0: auto - all of them, i.e. "
                                              "full quadratic, on a GPU; on a CPU chosen with k as above, else "
                                              f"{CPU_BRANCHES} on a bf16 CPU, {CPU_FP32_BRANCHES} on a float32 CPU; "
                                              ">= k+1: all)"),
        "adapter": Param("", str, help="PTP adapter folder (default: <model>/ptp, made by `train ptp`)"),
    }

    def available(self, engine) -> tuple[bool, str]:
        return trained_availability("the PTP adapter", lambda: P.adapter_for(engine), lambda ad: True,
                                    P.hint(engine))       # adapter_for refuses one made for another model

    def steps(self, run: Run):
        engine, request, p, out, cache = run.engine, run.request, run.params, run.out, run.cache
        ad = run.hold(P.PTPAdapter.require(engine, p["adapter"] or None).attached(engine.model))
        sp = request.sampling
        us = run.us                                   # verification (None = greedy: argmax)
        ud = us if us is not None else UStream(request.seed)   # the u's the slots carry
        gpu = engine.device.type != "cpu"
        fp32 = engine.dtype == torch.float32
        chosen = plan(engine, ad) if not (gpu or p["k"] or p["branches"]) else None
        if chosen is not None:
            k, budget = chosen["k"], chosen["branches"]
        else:
            k = p["k"] or (ad.block - 1 if gpu else CPU_FP32_K if fp32 else CPU_K)
            budget = p["branches"] or (0 if gpu else CPU_FP32_BRANCHES if fp32 else CPU_BRANCHES)
        k = min(k, ad.block - 1)
        slots = k + 1
        emb = engine.model.get_input_embeddings()
        tail, drafts, conf = list(run.ids), [], []    # uncached real tokens; drafts of the tokens after tail[-1]
        s = -1                                        # output index of tail[-1] (the prompt's last token: -1)
        prefill = True
        while True:
            left = out.budget - len(out.ids)          # tokens still wanted
            m = len(drafts)
            branches = choose_branches(conf, budget)
            nslots = max(1, min(slots, left))         # slot 1 targets the next base token; the rest draft
            real = tail + drafts
            allowed, offsets, aux_idx = layout(len(real), m, branches, nslots, engine.device)
            past = engine.cache_len(cache)
            with torch.inference_mode():
                e_real = emb(torch.tensor(real, device=engine.device)).to(engine.dtype)
                u_rows = [ud.span(s + j + 1, nslots) for j in branches]
                e_aux = torch.cat([ad.slot_inputs(u, sp.greedy) for u in u_rows]).to(engine.device, engine.dtype)
                embeds = torch.cat([e_real, e_aux])[None]
                with ad.gated(len(aux_idx)):             # the slots are the pass's last rows: a tail gate
                    logits = engine.forward(None, cache, (past + offsets)[None], engine.tree_mask(past, allowed),
                                            logits_to_keep=m + 1 + len(aux_idx), embeds=embeds, upcast=False)[0]
            rows, aux = logits[:m + 1], logits[m + 1:].view(len(branches), nslots, -1)
            v = verification.coupled(drafts, rows, sp, us, s + 1)
            j = v.accepted
            engine.crop(cache, past + len(real) - m + j)          # keep tail and d1..dj
            info = {"k": m, "branches": len(branches), "positions": len(real) + len(aux_idx)}
            if prefill and chosen is not None:
                info["plan"] = chosen
            step = out.step(v.tokens, forward_passes=1, drafted=m, prefill=prefill, info=info)
            step.accepted = min(j, len(step.token_ids))
            yield step
            if out.done:
                return
            prefill = False
            s += j + 1
            tail = [v.tokens[-1]]
            drafts, conf = [], []
            if j in branches and nslots > 1:
                lg = aux[branches.index(j), 1:]
                drafts, conf = self._draft(ad, lg, sp, ud, s + 1)

    @staticmethod
    def _draft(ad, logits: torch.Tensor, sp, ud: UStream, start: int) -> tuple[list[int], list[float]]:
        """Drafted tokens for output positions start.. from slot logits, with the drafter's confidence in each."""
        if ad.mode == "O" or sp.greedy:
            probs = torch.softmax(logits.float(), -1)
            toks = argmax(logits)
        else:                                       # C mode: the slot predicts a distribution; pick with u
            probs = process(logits, sp)
            toks = pick(probs, ud.span(start, logits.shape[0]).to(probs.device))
        conf = probs.gather(-1, toks.unsqueeze(-1)).squeeze(-1)
        return toks.tolist(), conf.tolist()
