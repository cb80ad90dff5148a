"""Matrix kernels for few-row passes: the weight-streaming linear (CPU), one row count per product (CUDA).

A decoding pass over T new tokens multiplies a (T, in) activation by every (out, in) weight. torch's
`F.linear` computes that as x @ W^T; on a CPU without AMX its float32 GEMM for small T packs the weight
before multiplying, so the weight crosses memory more than once and a pass over 4 tokens costs about 2.3x a
pass over one (measured on an AMD EPYC with AVX2: docs/bench/forward_cost.md). The same product written
W @ x^T (M = out rows, N = T columns) is the shape BLAS streams the weight through once: on that machine a
(4864 x 896) projection over 4 rows takes 1.2 ms instead of 3.0 ms, and the 151,936-row LM head over 4 rows
36 ms instead of 118 ms. That is the regime every verify-many-drafts strategy relies on.

In bfloat16 on a CPU with AMX, torch's `F.linear` hands oneDNN a plain weight, which it lays out for its AMX
kernels again at every call. `pack_linears(model)` keeps each weight in oneDNN's own layout instead (laid out
once, on first use, and again whenever the weight changes) and multiplies through it: on an Intel Xeon with
AMX-BF16 the (4864 x 896) projection over 1-16 rows takes 0.31 ms instead of 0.44 ms, the LM head 13 ms instead
of 18 ms.

Row-exactness. A verifying pass must give each row the numbers that row gets in a pass of its own, or a strategy
that caches drafted tokens from a many-row pass (the prompt plus proposals, say) drifts from `ar`, which computes
them one at a time. oneDNN's packed products are row-exact for most shapes at any row count, but not for every
shape, and which kernel switches where depends on the CPU. For the down projection of Qwen2.5-0.5B (896 x 4864):
on an Intel Xeon with AMX-BF16 a product over 33 or more rows runs another kernel, which gave 3 of 33 rows, 74 of
512 rows other numbers than the same rows alone (real activations, 2026-12-03); on an AMD EPYC with AVX512-BF16
(no AMX) every product over 2 or more rows agrees row for row, but a one-row product runs its own kernel, which
gave 18 of 64 random rows other numbers (2026-12-04). Random data shows both as real activations do. So each
packed weight's shape is probed once (`row_plan`) for the cheapest plan under which every row count gives each row
the same numbers: as it is; in pieces of at most `ROW_CHUNK` rows; a lone row padded with a zero row to two; or
both. Pieces cost prefill time for the shapes that need them (Qwen2.5-0.5B on the Xeon, 2 cores: a 128-token
prefill 131 -> 156 ms, 512 tokens 509 -> 577 ms) and nothing in passes of up to 32 rows; the padded row costs
nothing measurable (0.132 against 0.138 ms for that projection on the EPYC).

Sibling linears that read one input (q/k/v, gate/up) are stacked into one packed weight (`_Group`): over a
one-token pass of Qwen2.5-0.5B the linears take about 44 ms instead of 48 ms (fewer, larger products keep the
memory busy), with the separate products' numbers bit for bit.

`apply(model, device, dtype)` picks what fits the pair: paradec's native kernel for float32 on a CPU with AVX2/FMA
and g++ (paradec/native.py: row-exact by construction, weights read as bfloat16 where that is exact; the streamed
float32 linears below are its fallback), packed bfloat16 (oneDNN) where torch has it, or nothing.

`stream_linears(model)` switches a model's nn.Linear modules to it for every inference pass, each shape under the
plan `stream_plan` probed for it, so a row's numbers do not depend on how many rows share its pass (training, with
gradients, keeps `F.linear`). The result equals F.linear's up to float summation order. A first pass's prompt rows
(all but the last) are the exception: `ar` computes them in one pass too, so they go through one F.linear over
exactly those rows in every strategy (`prompt_rows`), at the BLAS's GEMM rate. Forward hooks (PTP's
gated LoRA) still run: only the module's `forward` is replaced.
"""
from __future__ import annotations

import copy
import os
import threading

import torch
from torch import nn
from torch.nn import functional as F

MAX_ROWS = 64
MIN_ROWS = 2
_TAG = "_paradec_streamed"


def streamed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    max_rows: int = MAX_ROWS, exact: bool = False) -> torch.Tensor:
    """F.linear(x, weight, bias), computed as (W @ x^T)^T when x has 2..max_rows rows and no gradient is needed.
    With `exact` (a target model's linears, `stream_linears`), every inference product on a CPU, of any row count,
    goes through the shape's probed `stream_plan`, so each row gets the numbers it gets alone."""
    rows = x.numel() // x.shape[-1] if x.numel() else 0
    if torch.is_grad_enabled() or x.device.type != "cpu" or not rows:
        return F.linear(x, weight, bias)
    if exact:
        plan = stream_plan(weight.shape[0], weight.shape[1], bias is not None, weight.dtype)
        x2 = x.reshape(rows, x.shape[-1])
        fast = _prompt_split(rows)
        if fast:
            y = F.linear(x2[:fast], weight, bias)
            if fast < rows:
                y = torch.cat([y, streamed_product(x2[fast:], weight, bias, plan)])
        else:
            y = streamed_product(x2, weight, bias, plan)
        return y.view(*x.shape[:-1], weight.shape[0])
    if rows < MIN_ROWS or rows > max_rows:
        return F.linear(x, weight, bias)
    return streamed_product(x.reshape(rows, x.shape[-1]), weight, bias, (1, None)).view(*x.shape[:-1],
                                                                                          weight.shape[0])


def streamed_product(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                     plan: tuple[int, int | None]) -> torch.Tensor:
    """(W @ x2^T)^T under `plan` = (quantum, most): rows padded with zero rows up to a multiple of `quantum` (and
    cut off again), products of at most `most` rows (None: one product)."""
    quantum, most = plan
    n = x2.shape[0]
    if most is not None and n > most:
        return torch.cat([streamed_product(x2[i:i + most], weight, bias, plan) for i in range(0, n, most)])
    if n % quantum:
        x2 = torch.cat([x2, x2.new_zeros(quantum - n % quantum, x2.shape[1])])
    y = torch.mm(weight, x2.t()) if bias is None else torch.addmm(bias.unsqueeze(1), weight, x2.t())
    return y.t()[:n].contiguous()


# Prompt rows. `ar` computes a prompt's rows in one pass of its own, so a strategy's numbers for those rows need
# only agree with that pass, not with each row alone: every prompt row but the last (whose logits give the first
# token, and which a strategy may feed in a pass of its own) can go through one F.linear over exactly those rows,
# whatever follows them in the pass. That is the same product, of the same shape, in every strategy's first pass, so
# the same numbers; F.linear over many rows runs at the BLAS's GEMM rate where the row-exact plan's pieces of 8 do
# not (AVX2 EPYC, fp32, default model: a 200-token prefill 3.0 s against 4.7 s). Below PROMPT_ROWS rows the plan
# is the cheaper and the prompt rows stay in it.
PROMPT_ROWS = 48
_PROMPT = threading.local()


class prompt_rows:
    """Within this context (one forward pass, this thread only), products over exactly `rows` rows compute their
    first `fast` rows (the prompt's rows but its last; `Engine.forward` says which) as one F.linear over those rows.
    Nothing changes when `fast` < PROMPT_ROWS, or with PARADEC_PROMPT_ROWS=0 in the environment (every row through
    the row plan, as before 2026-12-06: for comparisons)."""

    def __init__(self, rows: int, fast: int):
        on = fast >= PROMPT_ROWS and os.environ.get("PARADEC_PROMPT_ROWS", "1") != "0"
        self.split = (int(rows), int(fast)) if on else None

    def __enter__(self):
        self.prev = getattr(_PROMPT, "split", None)
        _PROMPT.split = self.split
        return self

    def __exit__(self, *exc):
        _PROMPT.split = self.prev
        return False


def prompt_fast(prompt: int, past: int, T: int) -> int:
    """How many leading rows of a pass of T new tokens after `past` cached ones are rows of a `prompt`-token prompt
    but its last (0 for prompt 0: unknown)."""
    return max(0, min(T, prompt - 1 - past)) if prompt > 1 else 0


class prompt_passes:
    """For a caller whose passes of `model` are not `Engine.forward`'s (transformers' generate): within this
    context, every pass of `model` in this thread splits its products as `prompt_rows` says for a `prompt`-token
    prompt fed from position 0 (a forward pre-hook reads each pass's rows and cache length)."""

    def __init__(self, model: nn.Module, prompt: int):
        self.model, self.prompt, self.me = model, int(prompt), threading.get_ident()

    def _pre(self, _mod, _args, kwargs):
        if threading.get_ident() != self.me:
            return
        x = kwargs.get("input_ids")
        x = kwargs.get("inputs_embeds") if x is None else x
        if x is None:
            return
        past = kwargs.get("past_key_values")
        past = int(past.get_seq_length()) if past is not None else 0
        one = x.shape[0] == 1
        _PROMPT.split = prompt_rows(x.shape[1], prompt_fast(self.prompt, past, x.shape[1]) if one else 0).split

    def _post(self, _mod, _args, _kwargs, _out):
        if threading.get_ident() == self.me:
            _PROMPT.split = None

    def __enter__(self):
        self.prev = getattr(_PROMPT, "split", None)
        self.hooks = [self.model.register_forward_pre_hook(self._pre, with_kwargs=True),
                      self.model.register_forward_hook(self._post, with_kwargs=True)]
        return self

    def __exit__(self, *exc):
        for h in self.hooks:
            h.remove()
        _PROMPT.split = self.prev
        return False


def _prompt_split(rows: int) -> int:
    """How many leading rows of this product are prompt rows for `prompt_rows` (0: none)."""
    split = getattr(_PROMPT, "split", None)
    return split[1] if split is not None and split[0] == rows else 0


# the plans `stream_plan` tries, cheapest first: (rows padded up to a multiple of, most rows per product)
STREAM_PLANS = ((1, None), (4, 8), (8, 8), (1, 1))
_STREAM_PLANS: dict[tuple, tuple[int, int | None]] = {}


def stream_plan(out_features: int, in_features: int, bias: bool, dtype: torch.dtype) -> tuple[int, int | None]:
    """The first of `STREAM_PLANS` under which the streamed product of this shape gives every row the numbers that
    row gets alone (itself through the plan), at rows 2, 3, 5, 9, 12, 17, 33, 64 and 100.

    The BLAS under torch picks its micro-kernel by the number of columns of W @ x^T, the rows of the pass: on an
    AMD EPYC with AVX2 only (2026-12-06) full tiles of 4 columns and the leftover 1-3 columns ran different
    kernels, and products over 12 or more columns another blocking, so a row's fp32 numbers depended on how many
    rows shared its pass (a prompt-plus-drafts pass gave the drafts other logits than `ar` computes one at a time).
    There products padded to 4 or 8 rows, in pieces of 8, agree row for row, and a one-row pass padded to 4 costs
    no more than F.linear's one row (4864 x 896: 1.7 ms against 1.8 ms; the LM head 38 against 53 ms). (1, 1)
    (every row its own product) is exact by construction. Probed once per shape with random data, at most 16,384
    output rows (the summation order of an output is set by the input width)."""
    key = (int(out_features), int(in_features), bool(bias), dtype)
    if key not in _STREAM_PLANS:
        g = torch.Generator().manual_seed(4321)
        w = (torch.randn(min(key[0], 16384), key[1], generator=g) * 0.02).to(dtype)
        b = (torch.randn(w.shape[0], generator=g) * 0.02).to(dtype) if bias else None
        x = torch.randn(100, key[1], generator=g).to(dtype)
        _STREAM_PLANS[key] = first_exact_plan(STREAM_PLANS, lambda rows, plan: streamed_product(rows, w, b, plan),
                                              x, (2, 3, 5, 9, 12, 17, 33, 64, 100), f"the fp32 product of shape {key}",
                                              STREAM_PLANS[-1])
    return _STREAM_PLANS[key]


def first_exact_plan(plans, product, x: torch.Tensor, counts, what: str, fallback):
    """The first of `plans` under which `product(x[:m], plan)` gives every row the numbers `product(row, plan)` gives
    it alone, for every m in `counts`; `fallback`, with a warning, when none does."""
    with torch.inference_mode():
        for plan in plans:
            alone = torch.cat([product(x[i:i + 1], plan) for i in range(x.shape[0])])
            if all(torch.equal(product(x[:m], plan), alone[:m]) for m in counts):
                return plan
    import warnings
    warnings.warn(f"paradec: no plan makes {what} row-exact on this CPU; lossless strategies may differ from ar at "
                  "near-ties", RuntimeWarning, stacklevel=3)
    return fallback


def stream_linears(model: nn.Module) -> int:
    """Use `streamed_linear` in every nn.Linear of `model` (idempotent), row-exact (`exact`), each shape's plan
    probed here (about 2.4 s for Qwen2.5-0.5B's shapes on 2 cores: at load, not in the first request's pass):
    returns how many were switched."""
    n = 0
    for mod in model.modules():
        if type(mod) is nn.Linear and not getattr(mod, _TAG, False):
            stream_plan(mod.weight.shape[0], mod.weight.shape[1], mod.bias is not None, mod.weight.dtype)
            mod.forward = _Streamed(mod)
            setattr(mod, _TAG, True)
            n += 1
    return n


class _Streamed:
    """A linear's streamed forward. It holds the module (not its tensors), so a deep copy of the module (a draft
    built from the target's layers) gets a forward that reads the copy's own weights."""

    def __init__(self, mod: nn.Linear):
        self.mod = mod

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return streamed_linear(x, self.mod.weight, self.mod.bias, exact=True)


def unstream_linears(model: nn.Module) -> None:
    """Undo `stream_linears` (back to nn.Linear.forward)."""
    for mod in model.modules():
        if getattr(mod, _TAG, False):
            del mod.forward
            setattr(mod, _TAG, False)


def wanted(device: torch.device, dtype: torch.dtype) -> bool:
    """Where the streamed form has been measured to win: float32 on a CPU."""
    return device.type == "cpu" and dtype == torch.float32


# ---------------------------------------------------------------- bf16: weights in oneDNN's layout

_PACK_TAG = "_paradec_packed"


def packing_available() -> bool:
    """torch was built with oneDNN, has its prepacked-linear operators, and this CPU runs oneDNN's bf16 path
    (AVX512 BW/VL/DQ or AVX-NE-CONVERT: an AVX2-only AMD EPYC has neither, and packing a weight there raises)."""
    ops = getattr(torch.ops, "mkldnn", None)
    if not (torch.backends.mkldnn.is_available() and ops is not None and hasattr(ops, "_reorder_linear_weight")
            and hasattr(ops, "_linear_pointwise")):
        return False
    check = getattr(ops, "_is_mkldnn_bf16_supported", None)
    try:
        return bool(check()) if check is not None else True
    except RuntimeError:
        return False


ROW_CHUNK = 32          # oneDNN's few-row kernels agree with each other up to this many rows (probed per shape)
# the plans `row_plan` tries, cheapest first: (fewest rows a product is given, most rows per product)
PLANS = ((1, None), (1, ROW_CHUNK), (2, None), (2, ROW_CHUNK))
_ROW_PLANS: dict[tuple[int, int], tuple[int, int | None]] = {}


def linear_packed(x2: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x2 (rows, in) bf16 through a packed weight (`pack`), in one oneDNN call."""
    return torch.ops.mkldnn._linear_pointwise(x2, packed, bias, "none", [], "")


def packed_product(x2: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None,
                   plan: tuple[int, int | None] = (1, None)) -> torch.Tensor:
    """x2 (rows, in) through a packed weight under `plan` = (least, most) rows per product (see `row_plan`):
    fewer rows than `least` are padded with zero rows (and cut off again), more than `most` go in pieces."""
    least, most = plan
    n = x2.shape[0]
    if n < least:
        pad = x2.new_zeros(least - n, x2.shape[1])
        return linear_packed(torch.cat([x2, pad]), packed, bias)[:n]
    if most is None or n <= most:
        return linear_packed(x2, packed, bias)
    return torch.cat([packed_product(x2[i:i + most], packed, bias, plan) for i in range(0, n, most)])


def row_plan(out_features: int, in_features: int) -> tuple[int, int | None]:
    """The first of `PLANS` under which oneDNN's packed bf16 product of this shape gives every row the numbers
    that row gets alone (itself through the plan), at rows 2, 3, 5, 17, 33, 40 and 64. Probed once per shape with
    random data; the probe's weight has at most 16,384 output rows (an LM head's 151,936 would cost a second; the
    summation order of an output is set by the input width). No plan working leaves the shape as it is, with a
    warning."""
    key = (int(out_features), int(in_features))
    if key not in _ROW_PLANS:
        g = torch.Generator().manual_seed(1234)
        w = (torch.randn(min(key[0], 16384), key[1], generator=g) * 0.02).to(torch.bfloat16)
        x = torch.randn(2 * ROW_CHUNK, key[1], generator=g).to(torch.bfloat16)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, 1)
        _ROW_PLANS[key] = first_exact_plan(PLANS, lambda rows, plan: packed_product(rows, packed, None, plan), x,
                                           (2, 3, 5, 17, 33, 40, 64), f"oneDNN's bf16 product of shape {key}",
                                           PLANS[0])
    return _ROW_PLANS[key]


class _Packed:
    """A linear's forward through its weight in oneDNN's layout, for bf16 inference on a CPU; anything else
    (gradients, another dtype or device) goes through F.linear. The packed copy is made on first use and again
    when the weight tensor or its version changes (an in-place update)."""

    def __init__(self, mod: nn.Linear):
        self.mod, self.tag, self.packed = mod, None, None

    def __deepcopy__(self, memo):                # a copied module packs its own weights
        return _Packed(copy.deepcopy(self.mod, memo))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        w, b = self.mod.weight, self.mod.bias
        if not _packable(x, (self.mod,)):
            return F.linear(x, w, b)
        tag = (w.data_ptr(), w._version)
        if tag != self.tag:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), 1)
            self.tag = tag
        y = packed_product(x.reshape(-1, x.shape[-1]), self.packed, None if b is None else b.detach(),
                           row_plan(w.shape[0], w.shape[1]))
        return y.view(*x.shape[:-1], w.shape[0])


# Linears that read the same input, by attribute name in their parent: an attention block's q/k/v projections
# and a gated MLP's gate/up projections (Llama, Qwen2, Mistral and their kin).
SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def _packable(x: torch.Tensor, mods) -> bool:
    """A bf16 inference product on a CPU: what the packed weights serve (anything else goes through F.linear)."""
    return not (torch.is_grad_enabled() or x.device.type != "cpu" or x.dtype != torch.bfloat16 or x.numel() == 0
                or any(m.weight.dtype != torch.bfloat16 or (m.bias is not None and m.bias.dtype != torch.bfloat16)
                       for m in mods))


class _Group:
    """Sibling linears multiplied as one: their weights stacked into one packed matrix, so a pass streams one
    (q+k+v) x in and one (gate+up) x in weight instead of three and two. In bf16 one product is as fast as
    its parts' in cache but fewer, larger products keep the memory busy: over the 24 layers of
    Qwen2.5-0.5B (a one-token pass) the linears take 42.6 ms stacked against 49.6 ms apart (Intel Xeon with
    AMX-BF16, 2 cores). The numbers are those of the separate products bit for bit (oneDNN's reduction over the
    input does not depend on how many output rows share the weight; tests/test_kernels.py checks it).

    The first sibling called with an input computes every sibling's output; the others take theirs when called
    with that same tensor (the parent passes one tensor to all of them), and the stash is dropped once each has
    taken its part. A sibling called with another input, or outside bf16 inference, computes its own product.
    While the stash lives, `whole` is the stacked product (the siblings' outputs are views of it), so a gated
    adapter can add a group's deltas into it once (paradec/adapters.py)."""

    def __init__(self, mods: list[nn.Linear]):
        self.mods, self.tag, self.packed, self.bias, self.sizes = mods, None, None, None, None
        self.x, self.outs, self.whole = None, None, None   # (a deep copy builds this from modules not yet filled in)

    def __deepcopy__(self, memo):
        return _Group([copy.deepcopy(m, memo) for m in self.mods])

    def output(self, i: int, x: torch.Tensor) -> torch.Tensor:
        if self.x is x and self.outs[i] is not None:      # stashed by a sibling from this very input
            y, self.outs[i] = self.outs[i], None
            if all(o is None for o in self.outs):
                self.x = self.outs = self.whole = None
            return y
        mods = self.mods
        if not _packable(x, mods):
            return F.linear(x, mods[i].weight, mods[i].bias)
        tag = tuple((t.data_ptr(), t._version) for m in mods for t in (m.weight, m.bias) if t is not None)
        if tag != self.tag:
            self.packed = None                      # free the old copy before making the new one
            self.packed = torch.ops.mkldnn._reorder_linear_weight(torch.cat([m.weight.detach() for m in mods]), 1)
            self.bias = None if mods[0].bias is None else torch.cat([m.bias.detach() for m in mods])
            self.sizes = [m.weight.shape[0] for m in mods]
            self.tag = tag
        y = packed_product(x.reshape(-1, x.shape[-1]), self.packed, self.bias,
                           row_plan(sum(self.sizes), x.shape[-1]))
        whole = y.view(*x.shape[:-1], y.shape[-1])
        outs = list(whole.split(self.sizes, -1))
        mine, outs[i] = outs[i], None
        self.x, self.outs, self.whole = x, outs, whole
        return mine


def stacked_output(mods, x: torch.Tensor) -> torch.Tensor | None:
    """The stacked product the `_Group` of `mods` (exactly its members, in order) holds for input `x` while its
    stash lives, None otherwise: the members' outputs for `x` are views of it, so adding to it in place adds
    to all of them, the outputs still to be taken included."""
    g = getattr(getattr(mods[0], "forward", None), "group", None)
    if (not isinstance(g, _Group) or g.x is not x or g.whole is None or len(g.mods) != len(mods)
            or any(a is not b for a, b in zip(g.mods, mods))):
        return None
    return g.whole


def pack(weight: torch.Tensor) -> torch.Tensor:
    """A bf16 (out, in) weight in oneDNN's layout, for `linear_packed` / `packed_product`."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(torch.bfloat16).contiguous(), 1)


class _Sibling:
    """The forward of member `i` of a `_Group`."""

    def __init__(self, group: _Group, i: int):
        self.group, self.i = group, i

    def __deepcopy__(self, memo):
        return _Sibling(copy.deepcopy(self.group, memo), self.i)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.output(self.i, x)


def sibling_groups(model: nn.Module) -> list[list[nn.Linear]]:
    """The `SIBLINGS` sets of `model` that can be stacked: plain nn.Linear modules with one input width, one
    dtype, and all or none with a bias."""
    groups = []
    for parent in model.modules():
        for names in SIBLINGS:
            mods = [getattr(parent, n, None) for n in names]
            if (all(type(m) is nn.Linear for m in mods) and len({m.in_features for m in mods}) == 1
                    and len({m.weight.dtype for m in mods}) == 1 and len({m.bias is None for m in mods}) == 1):
                groups.append(mods)
    return groups


def pack_linears(model: nn.Module, stack: bool = True) -> int:
    """Use packed weights in every nn.Linear of `model` (idempotent): sibling linears (`SIBLINGS`) stacked into
    one `_Group` when `stack`, every other linear `_Packed` alone. Returns how many linears were switched."""
    n = 0
    if stack:
        for mods in sibling_groups(model):
            if any(getattr(m, _PACK_TAG, False) for m in mods):
                continue
            group = _Group(mods)
            for i, m in enumerate(mods):
                m.forward = _Sibling(group, i)
                setattr(m, _PACK_TAG, True)
            n += len(mods)
    for mod in model.modules():
        if type(mod) is nn.Linear and not getattr(mod, _PACK_TAG, False):
            mod.forward = _Packed(mod)
            setattr(mod, _PACK_TAG, True)
            n += 1
    return n


def unpack_linears(model: nn.Module) -> None:
    """Undo `pack_linears` (back to nn.Linear.forward; the packed copies are freed)."""
    for mod in model.modules():
        if getattr(mod, _PACK_TAG, False):
            del mod.forward
            setattr(mod, _PACK_TAG, False)


def apply(model: nn.Module, device: torch.device, dtype: torch.dtype) -> str | None:
    """The few-row kernels that fit (device, dtype): 'native' (paradec/native.py) for float32 on a CPU with AVX2
    and a C++ compiler, else 'streamed'; 'packed' for bfloat16 on a CPU whose torch has oneDNN's prepacked linear
    (AMX or AVX512: faster there), else 'native' where it runs; None elsewhere (CUDA, MPS, float16). On CUDA the
    `Engine` makes its model row-exact instead (`fixed_rows`), whichever way the model was loaded."""
    from . import native
    if wanted(device, dtype):
        if native.available():
            native_linears(model)
            return "native"
        stream_linears(model)
        return "streamed"
    if device.type == "cpu" and dtype == torch.bfloat16:
        if packing_available() and packed_copy_fits(model):
            pack_linears(model)
            return "packed"
        if native.available():
            native_linears(model)
            return "native"
    return None


# ---------------------------------------------------------------- paradec's own kernel (AVX2 + FMA CPUs)

_NATIVE_TAG = "_paradec_native"


class _Native:
    """A linear's forward through paradec's native kernel (paradec/native.py) for inference on a CPU: row-exact by
    construction, the weight packed once (in bfloat16 where that is exact) and again when the weight tensor or its
    version changes. Gradients, another device or a dtype other than float32/bfloat16 go through F.linear. Safe
    under concurrent passes (the race runs strategies in threads): the (tag, packed) pair is replaced in one
    assignment, and packing holds a lock."""

    def __init__(self, mod: nn.Linear):
        self.mod, self.state, self.lock = mod, (None, None), threading.Lock()

    def __deepcopy__(self, memo):                # a copied module packs its own weights
        return _Native(copy.deepcopy(self.mod, memo))

    def packed(self) -> torch.Tensor:
        from . import native
        w = self.mod.weight
        tag = (w.data_ptr(), w._version)
        have, packed = self.state
        if have != tag:
            with self.lock:
                have, packed = self.state
                if have != tag:
                    self.state = (None, None)        # free the old copy before making the new one
                    packed = native.pack(w)
                    self.state = (tag, packed)
        return packed

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        from . import native
        w, b = self.mod.weight, self.mod.bias
        if (torch.is_grad_enabled() or x.device.type != "cpu" or w.device.type != "cpu"
                or x.dtype not in (torch.float32, torch.bfloat16)):
            return F.linear(x, w, b)
        return native.linear(x, self.packed(), w.shape[0], b)


def native_linears(model: nn.Module) -> int:
    """Use paradec's native kernel in every nn.Linear of `model` (idempotent); returns how many were switched.
    Raises RuntimeError where the kernel cannot run (`native.why()`)."""
    from . import native
    if not native.available():
        raise RuntimeError(f"paradec's native linear is not available: {native.why()}")
    n = 0
    for mod in model.modules():
        if type(mod) is nn.Linear and not getattr(mod, _NATIVE_TAG, False):
            mod.forward = _Native(mod)
            if mod.weight.device.type == "cpu":
                mod.forward.packed()             # at load, not in the first request's pass
            setattr(mod, _NATIVE_TAG, True)
            n += 1
    return n


def unnative_linears(model: nn.Module) -> None:
    """Undo `native_linears` (back to nn.Linear.forward; the packed copies are freed)."""
    for mod in model.modules():
        if getattr(mod, _NATIVE_TAG, False):
            del mod.forward
            setattr(mod, _NATIVE_TAG, False)


# ---------------------------------------------------------------- CUDA: every product over one row count

CUDA_ROWS = 64          # rows of every product on CUDA (a 64-row pass costs 1.02-1.08 one-row passes on an H200)
_FIXED_TAG = "_paradec_fixed_rows"


def fixed_rows_wanted(device: torch.device) -> bool:
    """Row-exact products on CUDA unless PARADEC_ROW_EXACT=0 (faster one-token passes, lossless only up to
    rounding: see `fixed_rows`)."""
    return device.type == "cuda" and os.environ.get("PARADEC_ROW_EXACT", "1") not in ("0", "false", "False")


def fixed_rows(model: nn.Module, rows: int = CUDA_ROWS) -> int:
    """Make `model`'s row-wise modules row-exact on CUDA (idempotent); returns how many were switched.

    cuBLAS picks its GEMM kernel (tiles, split-K) by the shape, and torch's CUDA reductions their block layout by
    the number of rows; either way a row's numbers depend on how many rows share its product. On an H200 with
    random weights of Llama-3-8B's shape, 3 of 128 rows of a many-row pass differed from the same rows computed
    one at a time (up to 0.098 in a logit; docs/bench/gpu-check.md), so `pld` and `lookahead` left `ar`'s tokens.
    Here every nn.Linear and every RMSNorm-like module (class name ending in "RMSNorm") computes its input in
    pieces of exactly `rows` rows, the last one padded to `rows` (`_FixedRows`): one kernel per weight, whatever the pass,
    so a row gets the numbers it gets alone. The rest of a decoder layer is element-wise (rotary, activation,
    residual) or attention (paradec/attention.py: float64 on CUDA). Training (gradients) is left as it is."""
    n = 0
    for mod in model.modules():
        if getattr(mod, _FIXED_TAG, False):
            continue
        if type(mod) is nn.Linear or (type(mod).__name__.endswith("RMSNorm") and hasattr(mod, "weight")):
            mod.forward = _FixedRows(mod, rows)
            setattr(mod, _FIXED_TAG, True)
            n += 1
    return n


class _FixedRows:
    """A module's forward over pieces of exactly `rows` rows (inference only; anything else as before).

    A short piece is copied into the first rows of a reused buffer of `rows` rows (one per thread, width, dtype and
    device) instead of being padded by a fresh concatenation: every module does this on every pass of a GPU
    decoding loop that is launch-bound, so a kernel launch saved per module counts. The buffer's other rows hold
    whatever an earlier product left there: a row's output reads only its own input row, so they change nothing
    but the rows cut off again."""

    _buffers = threading.local()

    def __init__(self, mod: nn.Module, rows: int):
        self.mod, self.rows = mod, rows

    def __deepcopy__(self, memo):
        return _FixedRows(copy.deepcopy(self.mod, memo), self.rows)

    def _one(self, x2: torch.Tensor) -> torch.Tensor:
        mod = self.mod
        if type(mod) is nn.Linear:
            return F.linear(x2, mod.weight, mod.bias)
        return type(mod).forward(mod, x2)

    def _padded(self, piece: torch.Tensor) -> torch.Tensor:
        bufs = self._buffers.__dict__.setdefault("by_shape", {})
        key = (self.rows, piece.shape[1], piece.dtype, piece.device)
        buf = bufs.get(key)
        if buf is None:
            buf = bufs[key] = piece.new_zeros(self.rows, piece.shape[1])
        buf[:piece.shape[0]].copy_(piece)
        return buf

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or x.numel() == 0:
            return self._one(x)
        x2 = x.reshape(-1, x.shape[-1])
        n, r = x2.shape[0], self.rows
        pieces = []
        for i in range(0, n, r):
            piece = x2[i:i + r]
            m = piece.shape[0]
            y = self._one(piece if m == r else self._padded(piece))
            pieces.append(y if m == r else y[:m])
        y = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
        return y.view(*x.shape[:-1], y.shape[-1])


def unfix_rows(model: nn.Module) -> None:
    """Undo `fixed_rows`."""
    for mod in model.modules():
        if getattr(mod, _FIXED_TAG, False):
            del mod.forward
            setattr(mod, _FIXED_TAG, False)


def available_memory() -> int | None:
    """Bytes of memory the system reports available now (None where it cannot say)."""
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def packed_copy_fits(model: nn.Module, available: int | None = ...) -> bool:
    """The packed weights are a second copy of every linear's weight (made as each is first used): pack only when
    that copy takes at most half of the memory available now, so a large model is not pushed out of memory
    (it then runs through F.linear, slower but whole)."""
    need = sum(m.weight.numel() * m.weight.element_size() for m in model.modules() if type(m) is nn.Linear)
    free = available_memory() if available is ... else available
    return free is None or need <= free // 2
