"""`ape`: Adaptive Parallel Encoding (Yang et al., ICLR 2025), training-free - `pcw` with APE's three changes on.

The context is read in parallel chunks exactly as `pcw` reads it (see `parallel_context.py`), with
  * a shared prefix: the prompt's opening (up to its first blank line, within `prefix` tokens) starts every
    chunk, so each chunk is encoded after the same instruction instead of starting cold;
  * an attention temperature T on the context (scores over context keys divided by T, T < 1 sharpens them);
  * a scaling factor S on the context's attention weights (S < 1 lowers the weight n chunks' worth of
    context would otherwise take from the question and the answer).
T = S = 0.9 is the setting of APE's own demonstration; every parameter can be set per request. Not lossless.
"""
from __future__ import annotations

from dataclasses import replace

from .base import register
from .parallel_context import ParallelContextWindows

APE_DEFAULTS = {"prefix": 256, "temperature": 0.9, "scale": 0.9}


@register
class AdaptiveParallelEncoding(ParallelContextWindows):
    name = "ape"
    title = "Adaptive Parallel Encoding"
    params = {k: replace(v, default=APE_DEFAULTS.get(k, v.default)) for k, v in ParallelContextWindows.params.items()}
