"""`ar`: the autoregressive baseline. Prefill, then one token per forward pass with a KV cache."""
from __future__ import annotations

from ..decoding import one_token_steps
from .base import Output, Request, Strategy, register, u_stream


@register
class Autoregressive(Strategy):
    name = "ar"
    title = "Autoregressive"
    lossless = True
    params = {}

    def stream(self, engine, request: Request):
        ids = request.validate(engine)
        cache = engine.new_cache()
        logits = engine.forward(ids, cache, logits_to_keep=1)[0, -1]
        yield from one_token_steps(engine, Output(engine, request), logits, cache,
                                   sampling=request.sampling, us=u_stream(request))
