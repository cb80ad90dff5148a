"""`ar`: the autoregressive baseline. Prefill, then one token per forward pass with a KV cache."""
from __future__ import annotations

from ..decoding import one_token_steps
from .base import Run, Strategy, register


@register
class Autoregressive(Strategy):
    name = "ar"
    title = "Autoregressive"
    lossless = True
    params = {}

    def steps(self, run: Run):
        engine, cache = run.engine, run.cache
        logits = engine.forward(run.ids, cache, logits_to_keep=1, upcast=False)[0, -1]
        yield from one_token_steps(engine, run.out, logits, cache, sampling=run.sampling, us=run.us)
