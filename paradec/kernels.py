"""CPU matrix kernels for few-row passes: the weight-streaming linear.

A decoding pass over T new tokens multiplies a (T, in) activation by every (out, in) weight. torch's
`F.linear` computes that as x @ W^T; on a CPU without AMX its float32 GEMM for small T packs the weight
before multiplying, so the weight crosses memory more than once and a pass over 4 tokens costs about 2.3x a
pass over one (measured on an AMD EPYC with AVX2: docs/bench/forward_cost.md). The same product written
W @ x^T (M = out rows, N = T columns) is the shape BLAS streams the weight through once: on that machine a
(4864 x 896) projection over 4 rows takes 1.2 ms instead of 3.0 ms, and the 151,936-row LM head over 4 rows
36 ms instead of 118 ms. That is the regime every verify-many-drafts strategy relies on.

`stream_linears(model)` switches a model's nn.Linear modules to it for inference passes of 2..`max_rows` rows
(training, with gradients, keeps `F.linear`; one row keeps `F.linear`, which is as fast there). The result
equals F.linear's up to float summation order. Forward hooks (PTP's gated LoRA) still run: only the module's
`forward` is replaced.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

MAX_ROWS = 64
MIN_ROWS = 2
_TAG = "_paradec_streamed"


def streamed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    max_rows: int = MAX_ROWS) -> torch.Tensor:
    """F.linear(x, weight, bias), computed as (W @ x^T)^T when x has 2..max_rows rows and no gradient is needed."""
    rows = x.numel() // x.shape[-1] if x.numel() else 0
    if rows < MIN_ROWS or rows > max_rows or torch.is_grad_enabled() or x.device.type != "cpu":
        return F.linear(x, weight, bias)
    x2 = x.reshape(rows, x.shape[-1])
    if bias is None:
        y = torch.mm(weight, x2.t())
    else:
        y = torch.addmm(bias.unsqueeze(1), weight, x2.t())
    return y.t().contiguous().view(*x.shape[:-1], weight.shape[0])


def stream_linears(model: nn.Module, max_rows: int = MAX_ROWS) -> int:
    """Use `streamed_linear` in every nn.Linear of `model` (idempotent). Returns how many were switched."""
    n = 0
    for mod in model.modules():
        if type(mod) is nn.Linear and not getattr(mod, _TAG, False):
            mod.forward = _Streamed(mod, max_rows)
            setattr(mod, _TAG, True)
            n += 1
    return n


class _Streamed:
    """A linear's streamed forward. It holds the module (not its tensors), so a deep copy of the module (a draft
    built from the target's layers) gets a forward that reads the copy's own weights."""

    def __init__(self, mod: nn.Linear, max_rows: int):
        self.mod, self.max_rows = mod, max_rows

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return streamed_linear(x, self.mod.weight, self.mod.bias, self.max_rows)


def unstream_linears(model: nn.Module) -> None:
    """Undo `stream_linears` (back to nn.Linear.forward)."""
    for mod in model.modules():
        if getattr(mod, _TAG, False):
            del mod.forward
            setattr(mod, _TAG, False)


def wanted(device: torch.device, dtype: torch.dtype) -> bool:
    """Where the streamed form has been measured to win: float32 on a CPU. (bf16 on AMX goes through oneDNN's
    own kernels, not measured here, so it stays on F.linear.)"""
    return device.type == "cpu" and dtype == torch.float32
