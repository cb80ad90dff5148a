"""Measured pass costs: what one forward pass over T new positions costs on this engine, by measurement.

Which pass width pays depends on the machine, not only on the model. On an Intel Xeon with AMX-BF16 a bf16 pass of
Qwen2.5-0.5B over 16 new positions cost about 1.1 one-position passes; on an AMD EPYC with AVX512-BF16 (no AMX)
the same products turn compute-bound beyond about 8 rows (a 9728 x 896 product: 0.22 / 0.56 / 0.96 ms at 1 / 8 /
16 rows), so 12 positions cost about 1.5 passes of one. A strategy that chooses how many positions to put in a
pass (ptp's drafts and branches) asks this module instead of assuming either machine.

`pass_costs(engine, widths, gate=...)` times passes of each width after a fixed context (the model's own causal
mask over the new positions, logits for every new position, as a verifying pass keeps them; `gate(T)` is entered
around each pass, for the adapter hooks a strategy's passes carry). Each width is timed `repeats` times,
interleaved with the others so a burst of noise does not land on one width; the figure is the fastest (the
least disturbed). Results are kept on the engine for the process (`engine.extras["pass_costs"]`, by `key`), so
a strategy measures once, in the benchmark's warm-up or the first request. `cost_at(costs, w)` interpolates.
"""
from __future__ import annotations

import time
from contextlib import nullcontext

import torch

CONTEXT = 128            # cached positions before the timed passes (a short chat prompt)
REPEATS = 3


def pass_costs(engine, widths, *, key: str = "plain", gate=None, context: int = CONTEXT,
               repeats: int = REPEATS) -> dict[int, float]:
    """{width: seconds of one forward pass over `width` new positions after `context` cached ones}. Widths
    measured before under the same `key` (the same gate) are not measured again."""
    store = engine.extras.setdefault("pass_costs", {}).setdefault(key, {})
    todo = sorted({int(w) for w in widths if int(w) >= 1} - set(store))
    if todo:
        gate = gate or (lambda _w: nullcontext())
        ids = _ids(engine, context + max(todo))
        cache = engine.new_cache()
        engine.forward(ids[:context], cache, logits_to_keep=1, upcast=False)
        best = {w: float("inf") for w in todo}
        for _ in range(max(1, repeats)):
            for w in todo:
                mask = engine.tree_mask(context, torch.ones(w, w, dtype=torch.bool).tril())
                pos = torch.arange(context, context + w, device=engine.device)[None]
                with gate(w):
                    engine.sync()
                    t = time.perf_counter()
                    engine.forward(ids[context:context + w], cache, pos, mask, logits_to_keep=w, upcast=False)
                    engine.sync()
                    best[w] = min(best[w], time.perf_counter() - t)
                engine.crop(cache, context)
        store.update(best)
    return {int(w): store[int(w)] for w in widths if int(w) >= 1}


def cost_at(costs: dict[int, float], width: float) -> float:
    """A pass's cost at `width` from measured `costs`: linear between the measured widths around it, the nearest
    measured one's slope beyond them."""
    ws = sorted(costs)
    if not ws:
        raise ValueError("no measured pass costs")
    if width in costs:
        return costs[width]
    if len(ws) == 1:
        return costs[ws[0]] * max(1.0, width / ws[0])
    lo = max([w for w in ws if w <= width], default=ws[0])
    hi = min([w for w in ws if w >= width], default=ws[-1])
    if lo == hi:                      # outside the measured range: extend the nearest segment
        i = ws.index(lo)
        lo, hi = (ws[0], ws[1]) if i == 0 else (ws[-2], ws[-1])
    slope = (costs[hi] - costs[lo]) / (hi - lo)
    return max(costs[lo] + slope * (width - lo), 1e-9)


def _ids(engine, n: int) -> list[int]:
    """n ordinary token ids of the engine's tokenizer (a repeated plain sentence), deterministic."""
    text = "The quick brown fox jumps over the lazy dog while the compiler checks every line of code. "
    ids = engine.tokenizer(text)["input_ids"] or [0]
    ids = [i for i in ids if i < engine.vocab_size] or [0]
    return (ids * (n // len(ids) + 1))[:n]
