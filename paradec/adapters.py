"""Gated adapters: trained deltas on a frozen model's linears that act only at chosen positions of a forward pass.

PTP (paradec/ptp.py), LUD (paradec/lud.py) and FocusLLM (paradec/focus.py) are each a small subclass of
`GatedAdapter`; this module is what they share.

* Positions: a `Gate` says where the deltas act in one forward pass - every position, the last n, listed
  sequence indices, or a (B, T) mask. `with adapter.gated(spec):` opens it for the forwards inside the block;
  closed, every hook returns at once and the model computes exactly the base model. At ungated positions
  nothing is added either way, so real tokens keep the base outputs bit for bit.
* Hooks: `attach(model)` registers the forward hooks (idempotent); a strategy wraps a whole generation in
  `with adapter.attached(model):`, so decoding registers them once per generation, never per forward, and a model
  carries no adapter hooks while other strategies run on it (a closed hook still costs a Python call per linear).
  `applied(model, spec)` is the one-off form: attached for the block only when it was not attached already.
  paradec's lean pass (paradec/fastpath.py) skips the linears' hooks where it can add the deltas itself
  (`fused`: bf16 on a CPU, batch 1, a few gated tail rows - LUD's and PTP's decoding passes), with the same numbers.
* Files: a folder with `adapter.safetensors` (written atomically) and the kind's JSON config (`CONFIG`); each
  subclass says which tensors go in under which names (`tensors`, `from_files`), so the files written before
  this module existed keep their layout and load unchanged.
* Finding: `find(engine, path)`: engine.extras[kind] when set (tests, trainers), else `path`, else the first
  folder with the files among <profile adapters>/<kind> (data/adapters/<model>/ for models paradec ships
  parameters for) and <model folder>/<kind>. `default_dir` is where trainers write: the first of those two.
* Fit: an adapter records its base model's signature (model type and sizes) and, since this module, a
  fingerprint of its weights (16 input-embedding rows); one that does not fit is refused with the reason and
  the command that trains one. Adapters saved before the fingerprint are checked as they were: their recorded
  signature and module shapes (and PTP's the model's name).

Contract of `find` (each module's `adapter_for`): None when there is no adapter; `AdapterError` (a
ValueError, saying where, why and how to train one) when there is one that does not fit or cannot be read.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from . import kernels, native

WEIGHTS = "adapter.safetensors"
_PACKING = kernels.packing_available()      # bf16 LoRA products in oneDNN's packed layout (`_packed_pair`)
_NATIVE = True             # bf16 deltas of a few tail rows through paradec's native kernel (`_group_delta`)
_FUSE = True               # ... and, in paradec's lean pass, without the hooks (`fused`)
_ON: dict[int, list] = {}  # id(model) -> the adapters whose hooks are on it
SIGNATURE = ("model_type", "hidden_size", "num_hidden_layers", "vocab_size")
_DEFAULT = object()        # "no gate given": the adapter's own default gate


class AdapterError(ValueError):
    """Trained parameters are missing, unreadable or do not fit the model; the message says why and what to do."""


def key(name: str) -> str:
    """A module name as a parameter-dict key ('model.layers.0.q_proj' -> 'model__layers__0__q_proj')."""
    return name.replace(".", "__")


def target_linears(model, targets) -> dict[str, nn.Linear]:
    """{module name: nn.Linear} for the decoder-layer linears whose last name part is in `targets`."""
    out = {}
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and name.rsplit(".", 1)[-1] in targets and re.search(r"\.layers\.\d+\.", name):
            out[name] = mod
    return out


def base_signature(model) -> dict:
    c = model.config
    return {"model_type": getattr(c, "model_type", ""), "hidden_size": int(c.hidden_size),
            "num_hidden_layers": int(c.num_hidden_layers), "vocab_size": int(c.vocab_size),
            "name": str(getattr(c, "_name_or_path", "") or "")}


def fingerprint(model) -> str:
    """A short hash of the model's first 16 input-embedding rows: tells apart models of one shape. The rows are
    rounded to bfloat16 first, so the same weights loaded in float32 or bfloat16 give the same fingerprint (for
    weights stored in bfloat16, like the default model's, this is the hash of the rows as loaded)."""
    w = model.get_input_embeddings().weight[:16].detach().to(torch.bfloat16).float().cpu().contiguous()
    return hashlib.sha1(w.numpy().tobytes()).hexdigest()[:16]


def base_record(model) -> dict:
    """What an adapter made for `model` records about it: its signature and its weights' fingerprint."""
    return {"base": base_signature(model), "base_fingerprint": fingerprint(model)}


def model_dir(model) -> Path | None:
    """The local folder the model was loaded from, when there is one."""
    p = str(getattr(model.config, "_name_or_path", "") or "")
    return Path(p) if p and os.path.isdir(p) else None


def fit_problem(recorded: dict, shapes: dict[str, tuple[int, int]], model, name: str | None = None,
                by_name: bool = False) -> str:
    """'' when parameters made for the model `recorded` describes (signature entries, "name", "fingerprint"), with
    modules of `shapes` {name: (in, out)}, fit `model`; else why not. Without a fingerprint (files from before
    it existed) the recorded signature and shapes decide, and with `by_name` the recorded name too."""
    mine = base_signature(model)
    for k in SIGNATURE:
        if recorded.get(k) not in (None, "") and recorded[k] != mine[k]:
            return f"{k}={recorded[k]}, this model has {k}={mine[k]}"
    fp = recorded.get("fingerprint")
    if fp:
        if fp != fingerprint(model):
            return f"other weights: fingerprint {fp}, this model's {fingerprint(model)}"
    elif by_name and recorded.get("name") and name and recorded["name"] != name:
        return f"a model named {recorded['name']}"
    mods = dict(model.named_modules())
    for n, (i, o) in shapes.items():
        m = mods.get(n)
        if m is None or (getattr(m, "in_features", None), getattr(m, "out_features", None)) != (i, o):
            return f"its module {n} has no counterpart of the same shape"
    return ""


class Gate:
    """The sequence positions of one forward pass an adapter acts on: `every` position, the last `tail`, the
    listed `index` positions, or where the (B, T) bool `mask` is set (kept for tail gates made from a mask too,
    for hooks that read it: LUD's STOP head)."""

    def __init__(self, every: bool = False, tail: int | None = None, index: torch.Tensor | None = None,
                 mask: torch.Tensor | None = None):
        self.every, self.tail, self.index, self.mask = every, tail, index, mask

    @classmethod
    def of(cls, spec, device) -> "Gate | None":
        """None (closed), "all", an int n (the last n positions), a bool (T,) / (B, T) mask (a suffix of gated
        positions in every row becomes a tail gate: the hooks then touch only that slice), or sequence indices."""
        if spec is None or isinstance(spec, Gate):
            return spec
        if isinstance(spec, str):
            if spec != "all":
                raise ValueError(f"unknown gate {spec!r}")
            return cls(every=True)
        if isinstance(spec, int):
            return cls(tail=spec)
        t = torch.as_tensor(spec)
        if t.dtype != torch.bool:
            return cls(index=t.to(dtype=torch.long, device=device))
        gate = t.unsqueeze(0) if t.dim() == 1 else t
        n = int(gate[0].flip(0).cumprod(0).sum())            # trailing gated positions of row 0
        suffix = bool(gate[:, gate.shape[1] - n:].all()) and not bool(gate[:, :gate.shape[1] - n].any())
        return cls(tail=n if suffix else None, mask=gate.to(device))

    def add(self, out: torch.Tensor, x: torch.Tensor, delta):
        """`out` plus delta(rows of `x`) at the gated positions (None: nothing to add). In place when no gradient
        is recorded; through autograd-friendly ops when one is (training)."""
        rows = self.gather(x)
        return None if rows is None else self.scatter(out, delta(rows))

    def gather(self, x: torch.Tensor) -> torch.Tensor | None:
        """The rows of `x` (B, T, in) a delta is computed for (None: none): the listed or trailing positions, or
        every row for an `every` or mask gate (`scatter` applies the mask)."""
        if self.index is not None:
            return x.index_select(-2, self.index)
        if self.tail is None:
            return x
        n = min(self.tail, x.shape[1])
        return None if n == 0 else x[:, -n:]

    def scatter(self, out: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        """`out` plus `d`, the delta of `gather`'s rows, at the gated positions."""
        grad = torch.is_grad_enabled()
        d = d.to(out.dtype)
        if self.index is not None:
            return out.index_add(-2, self.index, d) if grad else out.index_add_(-2, self.index, d)
        if self.tail is None and not self.every:
            return torch.where(self.mask.unsqueeze(-1), out + d, out)
        n = d.shape[1]
        if n == out.shape[1]:
            return out + d if grad else out.add_(d)
        if not grad:
            out[:, -n:] += d
            return out
        return torch.cat([out[:, :-n], out[:, -n:] + d], 1)

    def put(self, out: torch.Tensor, value: torch.Tensor):
        """`out` with the (hidden,) vector `value` at the gated positions (None: nothing to change)."""
        if self.tail is None:
            return torch.where(self.mask.unsqueeze(-1), value.expand_as(out), out)
        n = self.tail
        if n == 0:
            return None
        v = value.expand(out.shape[0], n, -1)
        if n == out.shape[1]:
            return v
        if not torch.is_grad_enabled():
            out[:, -n:] = v
            return out
        return torch.cat([out[:, :-n], v], 1)


def fused(model, x: torch.Tensor) -> "_Fused | None":
    """The deltas of the one adapter with an open gate on `model` for paradec's lean pass over input `x` (B, T,
    hidden) to add itself, or None (the pass then calls each linear as a module and the hooks act)."""
    ads = _ON.get(id(model))
    if not ads:
        return None
    live = [a for a in ads if a._gate is not None]
    return live[0]._fused(x) if len(live) == 1 else None


class _Fused:
    """One pass's gated LoRA deltas, added by paradec's lean pass (paradec/fastpath.py) instead of the hooks: it
    calls `linear(mod, x)` for every decoder linear, which runs the linear's own forward (the packed or stacked
    product, no hooks) and, at the first member of a sibling group called with `x`, adds the whole group's
    deltas for the gated tail rows into the stacked product in one `native.lora_add` call - the same kernel,
    operands and order as the hooks' native way (`_group_delta`), so the numbers are the same bit for bit.

    Why: through the hooks the same work cost 3.5-4.5 ms of Python a pass more (168 hook dispatches, the gate's
    gather, the stash, the stacked-output lookup and the argument checks of 96 `native.lora_add` calls; Intel Xeon
    with AMX-BF16, 2 threads, the default model's LUD parameters, 5 rows, 4 gated; docs/bench/lud-lean-cost-amx.md).
    Here a group costs a dict lookup and one foreign call, its pointers computed from the layout instead of through
    `lora_add`'s slices and checks. Building the plan (`GatedAdapter._fused`) costs ~0.3 ms a pass."""

    __slots__ = ("entries", "tail", "call", "done")

    def __init__(self, entries: dict, tail: int, call):
        self.entries, self.tail, self.call, self.done = entries, tail, call, {}

    def linear(self, mod: nn.Module, x: torch.Tensor) -> torch.Tensor:
        out = mod.forward(x)
        hit = self.entries.get(mod)
        if hit is None or not self.tail:
            return out
        members, col, pack = hit
        if self.done.get(members) is x:                    # a sibling called with this input added them
            return out
        self.done[members] = x
        T = x.shape[1]
        n = min(self.tail, T)
        sy, sx = out.stride(1), x.stride(1)
        if (x.stride(2) != 1 or out.stride(2) != 1 or sy != pack.outputs or x.shape[2] != pack.width
                or out.shape[0] != 1 or x.shape[0] != 1):
            raise RuntimeError(f"paradec: the lean pass's gated deltas found an unexpected layout at {mod}")
        a, r, nseg, seg, bt = pack.ptrs
        start = T - n
        if self.call(x.data_ptr() + 2 * start * sx, sx, n, pack.width, a, r, nseg, seg, bt,
                     out.data_ptr() + 2 * (start * sy - col), sy):
            raise RuntimeError("paradec: native.lora_add refused the lean pass's gated deltas")
        return out


class GatedAdapter(nn.Module):
    """Trained deltas on named linears of one base model, active only inside `gated(...)` and only at the gate's
    positions. Subclasses set the class constants and give `delta_for`, `file_config`, `tensors`, `file_shapes`,
    `from_files` (`shapes` unless they are LoRA pairs; `extra_hooks` for modules other than the linears)."""

    KIND = ""                  # the folder beside a model and the engine.extras key: "ptp", "lud", "focus"
    WHAT = ""                  # how messages name it: "PTP adapter"
    FORMAT = ""                # the config's "format" entry
    CONFIG = ""                # the config file's name
    WEIGHTS = WEIGHTS
    UNTAGGED_OK = False        # configs written before they carried a "format" entry load too
    NAME_CHECK = False         # without a fingerprint, the recorded model name must match (PTP's old rule)
    DEFAULT_GATE = None        # the gate of `gated()` / `applied(model)` without a spec

    def __init__(self):
        super().__init__()
        self.names: list[str] = []
        self._gate: Gate | None = None
        self._handles: list = []
        self.__dict__["_model"] = None         # not a submodule: the base weights are not the adapter's
        self._leases = 0                       # generations inside `attached` now
        self._by_lease = False                 # the hooks were put on by `attached` (and go when it ends)
        self.__dict__["_stash"] = None         # sibling linears' shared first LoRA product (see _linear_hook)
        self.__dict__["_stacks"] = {}          # their stacked parameters (see _stacked)
        self.__dict__["_packs"] = {}           # the same in oneDNN's bf16 layout (see _packed_pair)
        self.__dict__["_natives"] = {}         # the same for paradec's native kernel (see _native_pair)
        self.__dict__["_fits"] = None          # (model id, name) the fit check passed for
        self.__dict__["folder"] = None         # the folder `load` read it from (None: built in memory)

    # ------------------------------------------------------------------ what subclasses give
    def lora_pair(self, name: str):
        """(A (r, in), B (out, r), scale) when linear `name`'s delta is the low-rank scale * B A x; None when it is
        something else (`delta_for` then gives it)."""
        return self.lora_a[key(name)], self.lora_b[key(name)], 1.0

    def delta_for(self, name: str):
        """fn(x) -> the delta of linear `name` for input rows x (any dtype: the gate casts it). For a LoRA pair:
        scale * (x A^T) B^T in the parameters' dtype, through them (autograd sees the training steps)."""
        a, b, scale = self.lora_pair(name)

        def fn(x):
            return ((x.to(a.dtype) @ a.t()) * scale) @ b.t()
        return fn

    def shapes(self) -> dict[str, tuple[int, int]]:
        """{module name: (in_features, out_features)} the adapter's deltas were made for (here: those of LoRA
        pairs lora_a[key] (rank, in), lora_b[key] (out, rank))."""
        return {n: (self.lora_a[key(n)].shape[1], self.lora_b[key(n)].shape[0]) for n in self.names}

    def file_config(self) -> dict:
        """The JSON config file's content (format, structure, what it records about the base model, figures)."""
        raise NotImplementedError

    def tensors(self) -> dict[str, torch.Tensor]:
        """The weights file's tensors, under the names and in the dtypes the kind's files use."""
        raise NotImplementedError

    @classmethod
    def file_shapes(cls, cfg: dict, tensors: dict) -> dict[str, tuple[int, int]]:
        """`shapes` of the adapter a config and its weights file hold."""
        raise NotImplementedError

    @classmethod
    def from_files(cls, cfg: dict, tensors: dict, model=None) -> "GatedAdapter":
        """The adapter a config and its weights file hold (`load` has checked that they fit `model`, when given)."""
        raise NotImplementedError

    def extra_hooks(self, model) -> list:
        """[(module, forward hook)] besides the linears' (LUD: the pad embedding and the STOP head)."""
        return []

    @classmethod
    def recorded_in(cls, cfg: dict) -> dict:
        """What a config says about its base model: signature entries, "name" and "fingerprint"."""
        return {**(cfg.get("base") or {}), "fingerprint": cfg.get("base_fingerprint")}

    # ------------------------------------------------------------------ hooks
    def attach(self, model) -> "GatedAdapter":
        """Hook the deltas onto `model` (idempotent: once per model). Inactive until `gated(...)` opens the gate."""
        if self._model is model:
            return self
        self.detach()
        dev = next(model.parameters()).device
        if any(p.device != dev for p in self.parameters()):
            self.to(dev)         # built or loaded on the CPU: it follows the model it is attached to
        mods = dict(model.named_modules())
        missing = [n for n in self.names if n not in mods]
        if missing:
            raise AdapterError(f"this {self.WHAT} does not fit the model: it has no module {missing[0]}")
        groups = self._sibling_groups()
        self.__dict__["_mods"] = {n: mods[n] for n in self.names}
        self.__dict__["_group_mods"] = {m: [mods[n] for n in m] for m, _ in groups.values()}   # a group's linears
        for members, hit in list(self._packs.items()):      # kept across generations while its parameters are
            now = [t for n in members for t in self.lora_pair(n)[:2]]           # the very tensors it was built from
            if len(now) != len(hit[4]) or any(a is not b for a, b in zip(now, hit[4])):
                del self._packs[members]
        for members, hit in list(self._natives.items()):
            now = [t for n in members for t in self.lora_pair(n)[:2]]
            if len(now) != len(hit[0]) or any(a is not b for a, b in zip(now, hit[0])):
                del self._natives[members]
        for n in self.names:
            self._handles.append(mods[n].register_forward_hook(self._linear_hook(n, groups.get(n))))
        for mod, hook in self.extra_hooks(model):
            self._handles.append(mod.register_forward_hook(hook))
        self.__dict__["_model"] = model
        _ON.setdefault(id(model), []).append(self)
        return self

    def detach(self) -> None:
        self.__dict__["_stash"] = None
        self._by_lease = False
        for h in self._handles:
            h.remove()
        self._handles = []
        model = self._model
        if model is not None:
            ads = _ON.get(id(model), [])
            if self in ads:
                ads.remove(self)
            if not ads:
                _ON.pop(id(model), None)
        self.__dict__["_model"] = None

    def _linear_hook(self, name: str, group: tuple | None):
        fn = self.delta_for(name)
        if group is None:
            def hook(_mod, inputs, out):
                gate = self._gate
                return None if gate is None else gate.add(out, inputs[0], fn)
            return hook
        members, i = group

        def sibling_hook(_mod, inputs, out):
            gate = self._gate
            if gate is None:
                return None
            if torch.is_grad_enabled():
                return gate.add(out, inputs[0], fn)
            x, st = inputs[0], self._stash
            if st is None or st[0] is not x or st[1] is not gate or st[2] is not members:
                rows = gate.gather(x)
                if rows is None:
                    return None
                st = self.__dict__["_stash"] = self._group_delta(members, x, rows, gate, out)
            if st[3] is None:                  # native: added to the output every member's output is a view of
                return None
            if st[4] is None:                  # packed: st[3] holds every member's delta
                whole = st[6]
                if whole is not None and out.untyped_storage().data_ptr() == whole.untyped_storage().data_ptr():
                    return None                # added to the stacked product this output is a view of
                return gate.scatter(out, st[3][..., st[5][i]])
            return gate.scatter(out, st[3][..., st[5][i]] @ st[4][i])
        return sibling_hook

    # Decoding (no gradient): the LoRA pairs of sibling linears (kernels.SIBLINGS: q/k/v, gate/up), which read
    # one input, share their first product: x [A_q; A_k; A_v]^T is one matmul instead of three, and the rows
    # are gathered and converted once. The stash holds what the group computed for the input tensor the
    # siblings share (`is`, with the gate). Three ways on:
    # * bf16 on a CPU, batch 1, a tail gate of at most native.LORA_ROWS rows (a decoding pass's pad slots), with
    #   paradec's native kernel built (`native.lora_add`): the group's whole delta - first products, second products,
    #   the addition into the stacked output (or a lone linear's output) - is one call on the calling thread, in
    #   float32 inside. The oneDNN way below makes 2 calls a group, 192 a pass for 24 layers, each a parallel region
    #   of a few microseconds' work: on the AMX Xeon they cost 11-17 ms a pass (docs/bench/lud-verified-amx.md).
    # * bf16 on a CPU with oneDNN (`_packed_pair`): the second products are one too, through a block-diagonal
    #   [scale_q B_q, 0, 0; 0, scale_k B_k, 0; ...] (its zeros cost less than two more calls), both in bf16 in
    #   oneDNN's packed layout (half the bytes of float32; a rank-32 pair of Qwen2.5-0.5B's MLP reads 1.2 MB).
    #   When the model's siblings are stacked too (kernels._Group) the deltas are added once, into the stacked
    #   product their outputs are views of; the other siblings' hooks then have nothing left to do. Per layer
    #   4 first products, 4 second products and 4 additions instead of 4, 7 and 7 (plus 7 conversions). The
    #   default model with the shipped PTP adapter (AMD EPYC, AVX512-BF16, 2 threads, 128 cached tokens, three
    #   interleaved rounds, best of 5): 8 positions, 6 gated, 71.0-73.2 -> 68.5-70.0 ms (plain pass 55.0 ms);
    #   12 positions, 8 gated, 79.3-82.0 -> 73.6-76.1 ms (plain 61.0 ms). One gated row stays on the other
    #   way: a one-row bf16 oneDNN call costs more than the float32 matmul there.
    # * elsewhere each sibling's hook multiplies its columns of the first product by its scale * B^T, in
    #   float32 on a CPU (a few rows by a rank-r matrix: about 50 us against 80 us for a plain bf16 matmul).

    def _group_delta(self, members: tuple, x: torch.Tensor, rows: torch.Tensor, gate: Gate, out: torch.Tensor) -> tuple:
        """The stash for a group's input `x` (`out`: the output of the linear whose hook asks): (x, gate, members,
        product, per-member B^T or None, column slices, the output the deltas were added to or None)."""
        r2 = rows.reshape(-1, rows.shape[-1])
        if (_NATIVE and gate.tail is not None and x.dim() == 3 and x.shape[0] == 1 and x.dtype == torch.bfloat16
                and x.device.type == "cpu" and r2.shape[0] <= native.LORA_ROWS and native.available()):
            whole = out if len(members) == 1 else kernels.stacked_output(self._group_mods[members], x)
            if whole is not None and native.lora_add(r2, self._native_pair(members), whole[0, -r2.shape[0]:]):
                return (x, gate, members, None, None, None, whole)
        if x.device.type == "cpu" and x.dtype == torch.bfloat16 and _PACKING and r2.shape[0] > 1:
            ap, bp, cols = self._packed_pair(members)
            d = kernels.linear_packed(kernels.linear_packed(r2, ap), bp)
            d = d.view(*rows.shape[:-1], d.shape[-1])
            whole = None
            if gate.index is not None or gate.tail is not None or gate.every:      # scatter works in place
                whole = kernels.stacked_output(self._group_mods[members], x)
                if whole is not None and whole.shape[-1] == d.shape[-1]:
                    gate.scatter(whole, d)
                else:
                    whole = None
            return (x, gate, members, d, None, cols, whole)
        at, bts, cols = self._stacked(members, x)
        return (x, gate, members, rows.to(at.dtype) @ at, bts, cols, None)

    def _packed_pair(self, members: tuple):
        """(packed [A_1; A_2; ...], packed block-diagonal [scale_i B_i], each member's output columns), bf16,
        rebuilt whenever a parameter changes in place (its version) or, checked by `attach`, is another tensor."""
        hit = self._packs.get(members)
        if hit is not None and all(p._version == v for p, v in zip(hit[4], hit[5])):
            return hit[1], hit[2], hit[3]
        pairs = [self.lora_pair(n) for n in members]
        tag = tuple((id(a), id(b), float(sc)) for a, b, sc in pairs)
        if hit is None or hit[0] != tag:
            with torch.no_grad():
                r = sum(a.shape[0] for a, _, _ in pairs)
                out = sum(b.shape[0] for _, b, _ in pairs)
                bd = torch.zeros(out, r, dtype=torch.float32, device=pairs[0][0].device)
                o = c = 0
                cols = []
                for a, b, sc in pairs:
                    bd[o:o + b.shape[0], c:c + a.shape[0]] = b.float() * sc
                    cols.append(slice(o, o + b.shape[0]))
                    o, c = o + b.shape[0], c + a.shape[0]
                ap = kernels.pack(torch.cat([a for a, _, _ in pairs]))
                bp = kernels.pack(bd)
            params = [t for a, b, _ in pairs for t in (a, b)]
            hit = (tag, ap, bp, cols, params, [t._version for t in params])
            self._packs[members] = hit
        return hit[1], hit[2], hit[3]

    def _native_pair(self, members: tuple) -> native.LoraPack:
        """`native.LoraPack` of a sibling group's LoRA pairs, rebuilt whenever a parameter changes in place (its
        version) or, checked by `attach`, is another tensor."""
        hit = self._natives.get(members)
        if hit is not None and all(p._version == v for p, v in zip(hit[0], hit[1])):
            return hit[2]
        pairs = [self.lora_pair(n) for n in members]
        params = [t for a, b, _ in pairs for t in (a, b)]
        self._natives[members] = (params, [t._version for t in params], native.LoraPack(pairs))
        return self._natives[members][2]

    def _fused(self, x: torch.Tensor) -> "_Fused | None":
        """This pass's deltas for paradec's lean pass to add itself (see `fused`), or None: only a bf16 inference
        pass on a CPU, batch 1, gated on its last 0..native.LORA_ROWS rows (0: a pass with the gate shut, which adds
        nothing and then costs what a pass without the adapter does), with every linear a LoRA pair in a sibling
        group the model stacks exactly so (or alone), no hooks on them but paradec adapters' and none global."""
        gate = self._gate
        if not (_NATIVE and _FUSE and gate.tail is not None and gate.tail <= native.LORA_ROWS and x.dim() == 3
                and x.shape[0] == 1 and x.dtype == torch.bfloat16 and x.device.type == "cpu"
                and not torch.is_grad_enabled()):
            return None
        lib = native.library()
        if lib is None or nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks:
            return None
        owned = {h.id for ad in _ON.get(id(self._model), ()) for h in ad._handles}
        entries = {}
        for members, mods in self._group_mods.items():
            if len(mods) > 1:
                f = mods[0].forward
                if not isinstance(f, kernels._Sibling) or f.group.mods != mods:
                    return None
            pack = self._native_pair(members)
            col = 0
            for m in mods:
                if m.weight.dtype != torch.bfloat16 or m._forward_pre_hooks or not m._forward_hooks.keys() <= owned:
                    return None
                entries[m] = (members, col, pack)
                col += m.out_features
        if len(entries) != len(self.names):             # a linear whose delta is not a LoRA pair
            return None
        return _Fused(entries, gate.tail, lib.pd_lora_bf16)

    def _sibling_groups(self) -> dict[str, tuple]:
        """{module name: (its group's member names, its index)} for every LoRA-pair linear (siblings together)."""
        from .kernels import SIBLINGS
        by_parent: dict[tuple, list[str]] = {}
        for n in self.names:
            parent, last = n.rsplit(".", 1) if "." in n else ("", n)
            for sibs in SIBLINGS:
                if last in sibs and self.lora_pair(n) is not None:
                    by_parent.setdefault((parent, sibs), []).append(n)
        out = {}
        for (_, sibs), names in by_parent.items():
            members = tuple(sorted(names, key=lambda n: sibs.index(n.rsplit(".", 1)[-1])))
            out.update({n: (members, i) for i, n in enumerate(members)})
        for n in self.names:                   # a LoRA pair without siblings: a group of one
            if n not in out and self.lora_pair(n) is not None:
                out[n] = ((n,), 0)
        return out

    def _stacked(self, members: tuple, x: torch.Tensor):
        """([A_1; A_2; ...]^T, [scale_i * B_i^T], column slices) of a sibling group, in float32 on a CPU (x's
        dtype elsewhere), rebuilt whenever a parameter changes."""
        dt = torch.float32 if x.device.type == "cpu" else x.dtype
        pairs = [self.lora_pair(n) for n in members]
        tag = (dt, x.device, tuple((a._version, b._version, float(sc)) for a, b, sc in pairs))
        hit = self._stacks.get(members)
        if hit is None or hit[0] != tag:
            with torch.no_grad():
                at = torch.cat([a.t() for a, _, _ in pairs], 1).to(dt).contiguous()
                bts = [(b.t() * sc).to(dt).contiguous() for _, b, sc in pairs]
            edges = [0]
            for a, _, _ in pairs:
                edges.append(edges[-1] + a.shape[0])
            hit = (tag, at, bts, [slice(edges[j], edges[j + 1]) for j in range(len(pairs))])
            self._stacks[members] = hit
        return hit[1], hit[2], hit[3]

    def _device(self):
        return next(self.parameters()).device

    @contextmanager
    def gated(self, spec=_DEFAULT):
        """The deltas act at the positions `spec` gives (see `Gate.of`; None: nowhere) in the forwards inside the
        block. The adapter must be attached."""
        if self._model is None:
            raise AdapterError(f"this {self.WHAT} is not attached to a model (attach(model) first)")
        prev = self._gate
        self._gate = Gate.of(self.DEFAULT_GATE if spec is _DEFAULT else spec, self._device())
        try:
            yield self
        finally:
            self._gate = prev

    @contextmanager
    def attached(self, model):
        """The hooks on `model` for the block - a strategy wraps one whole generation in it: attached once at its
        start, removed when the last generation using them ends (several lanes of a race may share one adapter),
        unless `attach` had put them there before. So a model carries no adapter hooks while other strategies run
        on it alone, and their timings pay nothing for an adapter they do not use."""
        if self._model is not model:
            self.attach(model)
            self._by_lease = True
        self._leases += 1
        try:
            yield self
        finally:
            self._leases -= 1
            if self._leases == 0 and self._by_lease:
                self._by_lease = False
                self.detach()

    @contextmanager
    def applied(self, model, spec=_DEFAULT):
        """`gated(spec)` on `model`, attaching the hooks for the block when they were not attached already."""
        with self.attached(model), self.gated(spec):
            yield self

    # ------------------------------------------------------------------ files
    def save(self, folder) -> Path:
        from safetensors.torch import save_file
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / (self.WEIGHTS + ".tmp")
        save_file(self.tensors(), str(tmp), metadata={"format": "pt", "kind": self.FORMAT})
        os.chmod(tmp, 0o644)
        os.replace(tmp, folder / self.WEIGHTS)
        (folder / self.CONFIG).write_text(json.dumps(self.file_config(), indent=1, default=str) + "\n")
        return folder

    @classmethod
    def load(cls, folder, model=None, device=None, name: str | None = None) -> "GatedAdapter":
        """The adapter in `folder`; AdapterError when there is none, it is not one of this kind or, with a `model`
        (named `name`), it was made for another model."""
        from safetensors.torch import load_file
        folder = Path(folder)
        if not (folder / cls.WEIGHTS).exists() or not (folder / cls.CONFIG).exists():
            raise AdapterError(f"no {cls.WHAT} at {folder} (expected {cls.WEIGHTS} and {cls.CONFIG})")
        try:
            cfg = json.loads((folder / cls.CONFIG).read_text())
        except ValueError as e:
            raise AdapterError(f"{folder / cls.CONFIG} is not valid JSON: {e}") from e
        fmt = cfg.get("format")
        if fmt != cls.FORMAT and not (fmt is None and cls.UNTAGGED_OK):
            raise AdapterError(f"{folder / cls.CONFIG} is not a paradec {cls.KIND} config")
        tensors = load_file(str(folder / cls.WEIGHTS))
        if model is not None:
            why = fit_problem(cls.recorded_in(cfg), cls.file_shapes(cfg, tensors), model, name, cls.NAME_CHECK)
            if why:
                raise cls.refusal(cls.recorded_in(cfg), why, folder, model, name)
        ad = cls.from_files(cfg, tensors, model)
        ad.__dict__["folder"] = folder         # where it was read from (files beside it: PTP's decoding.json)
        if device is not None:
            ad.to(device)
        return ad.eval()

    # ------------------------------------------------------------------ fit
    def problem(self, model, name: str | None = None) -> str:
        """'' when the adapter fits `model`, else why not (see `fit_problem`)."""
        return fit_problem(self.recorded_in(self.file_config()), self.shapes(), model, name, self.NAME_CHECK)

    def fits(self, model) -> bool:
        return not self.problem(model)

    @classmethod
    def refusal(cls, recorded: dict, why: str, where, model, name: str | None = None) -> AdapterError:
        """The error for parameters in `where` that do not fit `model` (named `name`), with how to train some."""
        return AdapterError(f"the {cls.WHAT} in {where}: trained for {recorded.get('name') or 'another model'} "
                            f"({why}), not for {name or base_signature(model)['name'] or 'this model'}; "
                            f"{cls.hint_for(model, name or '<model>')}")

    def check(self, engine, where) -> None:
        """AdapterError when the adapter does not fit the engine's model (the result is remembered)."""
        if self._fits == (id(engine.model), engine.name):
            return
        why = self.problem(engine.model, engine.name)
        if why:
            raise self.refusal(self.recorded_in(self.file_config()), why, where, engine.model, engine.name)
        self.__dict__["_fits"] = (id(engine.model), engine.name)

    # ------------------------------------------------------------------ finding an engine's adapter
    @classmethod
    def hint_for(cls, model, name: str) -> str:
        d = model_dir(model)
        if d is not None and Path(d).resolve().is_relative_to(Path.cwd().resolve()):
            d = Path(d).resolve().relative_to(Path.cwd().resolve())      # no machine's absolute path in messages
        return f"train it: python -m paradec train {cls.KIND} --model {d or name}"

    @classmethod
    def hint(cls, engine) -> str:
        """The command that trains this kind of adapter for the engine's model."""
        return cls.hint_for(engine.model, engine.name)

    @classmethod
    def folders(cls, engine) -> list[Path]:
        """Where the engine's adapter of this kind may be: <profile adapters>/<kind>, <model folder>/<kind>."""
        prof = getattr(engine, "profile", None)
        out = [Path(prof.adapters) / cls.KIND] if prof is not None and prof.adapters is not None else []
        d = model_dir(engine.model)
        if d is not None and d / cls.KIND not in out:
            out.append(d / cls.KIND)
        return out

    @classmethod
    def default_dir(cls, engine) -> Path | None:
        """Where a trainer writes the engine's adapter: the shipped location for a model whose profile ships
        parameters (data/adapters/<model>/<kind>), else <model folder>/<kind> (None: the model has no folder)."""
        dirs = cls.folders(engine)
        return dirs[0] if dirs else None

    @classmethod
    def find(cls, engine, path=None) -> "GatedAdapter | None":
        """The engine's adapter of this kind, checked against its model: engine.extras[KIND] if set, else the one at
        `path`, else the first default folder holding one. None when there is none. Loaded adapters are kept in
        engine.extras. It is not attached: a strategy holds it on the model for a generation (`attached`)."""
        if path:
            cache = engine.extras.setdefault(f"{cls.KIND}_paths", {})
            where = Path(path)
            k = str(where.resolve())
            if k not in cache:
                cache[k] = cls._load_for(engine, where)
            ad = cache[k]
        else:
            ad = engine.extras.get(cls.KIND)
            if ad is None:
                where = next((d for d in cls.folders(engine)
                              if (d / cls.WEIGHTS).exists() and (d / cls.CONFIG).exists()), None)
                if where is None:
                    return None
                ad = engine.extras[cls.KIND] = cls._load_for(engine, where)
            else:
                ad.check(engine, f"engine.extras[{cls.KIND!r}]")
        return ad

    @classmethod
    def require(cls, engine, path=None) -> "GatedAdapter":
        """`find`, with FileNotFoundError (and the command that trains one) when there is none."""
        ad = cls.find(engine, path)
        if ad is None:
            raise FileNotFoundError(f"no {cls.WHAT} for {engine.name}: {cls.hint(engine)}")
        return ad

    @classmethod
    def _load_for(cls, engine, folder: Path) -> "GatedAdapter":
        ad = cls.load(folder, engine.model, device=engine.device, name=engine.name)
        ad.check(engine, folder)             # (remembered: not checked again)
        return ad
