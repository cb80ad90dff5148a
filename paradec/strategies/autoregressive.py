"""`ar`: the autoregressive baseline. Prefill, then one token per forward pass with a KV cache."""
from __future__ import annotations

from ..sampling import next_tokens
from .base import Output, Request, Strategy, register, u_stream


@register
class Autoregressive(Strategy):
    name = "ar"
    title = "Autoregressive"
    lossless = True
    params = {}

    def stream(self, engine, request: Request):
        ids = request.validate(engine)
        sp, us = request.sampling, u_stream(request)
        out = Output(engine, request)
        cache = engine.new_cache()
        logits = engine.forward(ids, cache, logits_to_keep=1)[0, -1]
        prefill = True
        while True:
            tok = int(next_tokens(logits, sp, us[len(out.ids)] if us else None))
            step = out.step([tok], forward_passes=1, prefill=prefill)
            yield step
            if out.done:
                return
            prefill = False
            logits = engine.forward([tok], cache, logits_to_keep=1)[0, -1]
