"""Parallel Token Prediction (PTP, Draxler et al., arXiv 2512.21323): the model side.

A PTP adapter turns any Llama-style transformers model into its own drafter without touching its modelling
code. Sampling is written t_i = Pick(u_i, P_i); a model that is *given* u_i .. u_k can output t_k without
seeing t_i .. t_{k-1}, so one pass yields several tokens.

* Auxiliary slots come after the context. Each carries one u, embedded from the 32 bits of u as float32
  (a 32-vector of 0/1 floats) through Linear(32 -> hidden), plus a learned base vector and a learned mode
  vector (sampled vs greedy requests: a greedy target is the argmax whatever u is, a sampled one depends on
  u, so the drafter is told which it is drafting for). The slots go in through `inputs_embeds`.
* Positions: auxiliary slot 1 shares the position of the last context token; later slots continue.
* Gated LoRA (rank r) on the attention and MLP linears, applied ONLY at the auxiliary slots. It is attached
  with forward hooks on the nn.Linear modules and gated by the positions set before a forward
  (`adapter.gated(idx)`): real tokens go through the unchanged base weights (bit for bit - nothing is added
  to their outputs), so one model with one KV cache is verifier and drafter at once.
* Modes: "O" (one-hot PTP, distilled from a teacher): slot k sees u_1..u_k and its argmax is t_k.
  "C" (categorical PTP, teacher-free): slot k sees u_1..u_{k-1} (slot 1 a learned start vector) and predicts
  the distribution of t_k; the draft is Pick(u_k, that distribution).

An adapter lives in a folder: `adapter.safetensors` (the LoRA factors in bfloat16, the rest float32) +
`adapter_config.json`. The default one of a model paradec ships for is in data/adapters/<model>/ptp/ (the
provisioned model folder is not part of the repository); any other model's is `<model>/ptp/`. An adapter
records the model it was trained for and refuses another.
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

FORMAT = "paradec-ptp"
VERSION = 1
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADAPTER_DIR = "ptp"
WEIGHTS = "adapter.safetensors"
CONFIG = "adapter_config.json"
TRAIN_HINT = "train it: python -m paradec train ptp --model {model}"

_BITS = torch.arange(32, dtype=torch.int32)


def u_bits(u) -> torch.Tensor:
    """u (...,) in [0, 1) -> (..., 32) float 0/1: the IEEE-754 bits of u as float32, least significant first."""
    u = torch.as_tensor(u, dtype=torch.float32).contiguous()
    i = u.view(torch.int32)
    return ((i.unsqueeze(-1) >> _BITS.to(i.device)) & 1).float()


def target_linears(model, targets=TARGETS) -> dict[str, nn.Linear]:
    """The nn.Linear modules the LoRA goes on: those whose name ends in one of `targets` (the LM head is not)."""
    out = {}
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and name.rsplit(".", 1)[-1] in targets:
            out[name] = mod
    if not out:
        raise ValueError(f"no linear layers named {', '.join(targets)} in {type(model).__name__}: "
                         "PTP needs a Llama-style model")
    return out


class PTPAdapter(nn.Module):
    """u embedding + gated LoRA for one base model. Parameters stay float32 whatever the model's dtype."""

    def __init__(self, hidden: int, shapes: dict[str, tuple[int, int]], rank: int = 32, alpha: float | None = None,
                 block: int = 16, mode: str = "O", meta: dict | None = None):
        super().__init__()
        if mode not in ("O", "C"):
            raise ValueError(f"mode must be 'O' or 'C', got {mode!r}")
        self.hidden, self.rank, self.block, self.mode = hidden, int(rank), int(block), mode
        self.alpha = float(alpha if alpha is not None else 2 * rank)
        self.scale = self.alpha / self.rank
        self.meta = dict(meta or {})
        self.names = sorted(shapes)
        self.u_proj = nn.Linear(32, hidden)
        nn.init.normal_(self.u_proj.weight, std=0.02)
        nn.init.zeros_(self.u_proj.bias)
        self.u_base = nn.Parameter(torch.zeros(hidden))
        self.u_mode = nn.Parameter(torch.zeros(2, hidden))     # 0: sampled request, 1: greedy request
        self.u_start = nn.Parameter(torch.zeros(hidden))       # C mode: the input of slot 1 (no u yet)
        self.lora_a = nn.ParameterDict()
        self.lora_b = nn.ParameterDict()
        for n in self.names:
            fan_in, fan_out = shapes[n]
            key = n.replace(".", "__")
            self.lora_a[key] = nn.Parameter(torch.randn(rank, fan_in) / fan_in ** 0.5)
            self.lora_b[key] = nn.Parameter(torch.zeros(fan_out, rank))
        self._idx = None          # None: off; "all": every position; LongTensor: these positions
        self._handles = []
        self._pack: dict = {}
        self.__dict__["_model"] = None          # not a submodule: the base weights are not the adapter's

    # ------------------------------------------------------------ building
    @classmethod
    def for_model(cls, model, rank: int = 32, block: int = 16, mode: str = "O", alpha=None, targets=TARGETS,
                  meta=None, init_from_embeddings: bool = True) -> "PTPAdapter":
        lin = target_linears(model, targets)
        shapes = {n: (m.in_features, m.out_features) for n, m in lin.items()}
        ad = cls(int(model.config.hidden_size), shapes, rank=rank, alpha=alpha, block=block, mode=mode, meta=meta)
        if init_from_embeddings:     # start the u slots in the region of the model's input space
            with torch.no_grad():
                emb = model.get_input_embeddings().weight.float()
                ad.u_base.copy_(emb.mean(0).cpu())
        ad.meta.setdefault("targets", list(targets))
        ad.to(next(model.parameters()).device)
        return ad

    def config(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "hidden_size": self.hidden, "rank": self.rank,
                "alpha": self.alpha, "block": self.block, "mode": self.mode, "modules": self.names,
                "u_embedding": "float32 bits -> Linear(32, hidden) + base + mode vector", **self.meta}

    # ------------------------------------------------------------ hooks
    def attach(self, model) -> "PTPAdapter":
        """Hook the LoRA onto `model`'s linears (idempotent). Inactive until `gated(...)` sets positions."""
        if self._model is model:
            return self
        self.detach()
        lin = target_linears(model, self.meta.get("targets", TARGETS))
        missing = set(self.names) - set(lin)
        if missing:
            raise ValueError(f"this PTP adapter does not fit the model: no module {sorted(missing)[0]}")
        for n in self.names:
            self._handles.append(lin[n].register_forward_hook(self._hook(n.replace(".", "__"))))
        self.__dict__["_model"] = model
        return self

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self.__dict__["_model"] = None

    def _hook(self, key: str):
        def hook(_mod, inputs, out):
            idx = self._idx
            if idx is None:
                return None
            x = inputs[0]
            if torch.is_grad_enabled():        # training: through the parameters, for autograd
                a, b = self.lora_a[key], self.lora_b[key]
                if isinstance(idx, str):       # every position is an auxiliary slot (training's slot pass)
                    return out + ((x.to(a.dtype) @ a.T) @ b.T * self.scale).to(out.dtype)
                d = (x.index_select(-2, idx).to(a.dtype) @ a.T) @ b.T * self.scale
                return out.index_add(-2, idx, d.to(out.dtype))
            at, bt = self._packed(key, out.dtype)   # decoding: few small ops (this runs 7 times a layer)
            if isinstance(idx, str):
                return out.add_((x @ at) @ bt)
            return out.index_add_(-2, idx, (x.index_select(-2, idx) @ at) @ bt)
        return hook

    def _packed(self, key: str, dtype):
        """A^T and scale * B^T in the model's dtype, rebuilt whenever the parameters change."""
        a, b = self.lora_a[key], self.lora_b[key]
        tag = (a._version, b._version, dtype, a.device)
        hit = self._pack.get(key)
        if hit is None or hit[0] != tag:
            with torch.no_grad():
                hit = (tag, a.T.to(dtype).contiguous(), (b.T * self.scale).to(dtype).contiguous())
            self._pack[key] = hit
        return hit[1], hit[2]

    @contextmanager
    def gated(self, idx):
        """LoRA on at positions `idx` (sequence indices of this forward's input, or "all") inside the block."""
        prev = self._idx
        self._idx = idx if (idx is None or isinstance(idx, str)) else torch.as_tensor(
            idx, dtype=torch.long, device=self.u_base.device)
        try:
            yield self
        finally:
            self._idx = prev

    # ------------------------------------------------------------ u slots
    def embed_u(self, u, greedy, start=None) -> torch.Tensor:
        """Slot inputs (..., hidden) from u (...,). greedy: bool or bool tensor (...,). start: bool tensor marking
        C-mode first slots (they get the start vector instead of a u)."""
        u = torch.as_tensor(u, dtype=torch.float32, device=self.u_base.device)
        e = self.u_proj(u_bits(u)) + self.u_base
        g = torch.as_tensor(greedy, dtype=torch.long, device=e.device).expand(u.shape)
        e = e + self.u_mode[g]
        if start is not None:
            start = torch.as_tensor(start, dtype=torch.bool, device=e.device)
            e = torch.where(start.unsqueeze(-1), self.u_start + self.u_mode[g], e)
        return e

    def slot_inputs(self, us, greedy: bool) -> torch.Tensor:
        """The K slot inputs for one block whose slot k targets the token of us[k-1]: O mode feeds u_k at slot k,
        C mode feeds u_{k-1} (slot 1 the start vector). us (K,) -> (K, hidden)."""
        us = torch.as_tensor(us, dtype=torch.float32)
        if self.mode == "O":
            return self.embed_u(us, greedy)
        shifted = torch.cat([us.new_zeros(1), us[:-1]])
        start = torch.zeros(len(us), dtype=torch.bool)
        start[0] = True
        return self.embed_u(shifted, greedy, start)

    # ------------------------------------------------------------ files
    def save(self, folder) -> Path:
        from safetensors.torch import save_file
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        # LoRA factors in bfloat16 (rank 32 on a 0.5B model: 35 MB instead of 70), the small rest float32
        state = {k: v.detach().cpu().to(torch.bfloat16 if k.startswith("lora_") else torch.float32).contiguous()
                 for k, v in self.state_dict().items()}
        save_file(state, str(folder / WEIGHTS), metadata={"format": FORMAT})
        (folder / CONFIG).write_text(json.dumps(self.config(), indent=1, default=str) + "\n")
        return folder

    @classmethod
    def load(cls, folder, device=None) -> "PTPAdapter":
        from safetensors.torch import load_file
        folder = Path(folder)
        cfg = json.loads((folder / CONFIG).read_text())
        if cfg.get("format") != FORMAT:
            raise ValueError(f"{folder / CONFIG} is not a paradec PTP adapter config")
        state = load_file(str(folder / WEIGHTS))
        shapes = {}
        for n in cfg["modules"]:
            key = n.replace(".", "__")
            shapes[n] = (state[f"lora_a.{key}"].shape[1], state[f"lora_b.{key}"].shape[0])
        known = {"format", "version", "hidden_size", "rank", "alpha", "block", "mode", "modules", "u_embedding"}
        ad = cls(cfg["hidden_size"], shapes, rank=cfg["rank"], alpha=cfg["alpha"], block=cfg["block"],
                 mode=cfg["mode"], meta={k: v for k, v in cfg.items() if k not in known})
        ad.load_state_dict({k: v.float() for k, v in state.items()})
        if device is not None:
            ad.to(device)
        return ad.eval()


# ---------------------------------------------------------------- finding an engine's adapter

def model_dir(engine) -> Path | None:
    """The local folder the engine's model was loaded from, when there is one."""
    p = getattr(engine.model.config, "_name_or_path", "") or ""
    return Path(p) if p and os.path.isdir(p) else None


def default_adapter_dir(engine) -> Path | None:
    """<profile adapters>/ptp for a model whose profile ships its parameters (data/adapters/<model>/), else
    <model folder>/ptp (None: the model has no folder)."""
    prof = getattr(engine, "profile", None)
    if prof is not None and prof.adapters is not None:
        return Path(prof.adapters) / ADAPTER_DIR
    d = model_dir(engine)
    return d / ADAPTER_DIR if d is not None else None


def fingerprint(model) -> str:
    """A short hash of the model's first input-embedding rows (as float32): tells apart models of one shape."""
    import hashlib
    w = model.get_input_embeddings().weight[:16].detach().float().cpu().contiguous()
    return hashlib.sha1(w.numpy().tobytes()).hexdigest()[:16]


def check_fits(ad: "PTPAdapter", engine, where) -> None:
    """ValueError with the reason when `ad` was trained for another model than the engine's: by the weights'
    fingerprint when the adapter records one, else by the model's name."""
    base = ad.meta.get("base_model")
    fp = ad.meta.get("base_fingerprint")
    other = fp != fingerprint(engine.model) if fp else bool(base and base != engine.name)
    if ad.hidden != int(engine.model.config.hidden_size) or other:
        raise ValueError(f"the PTP adapter in {where} was trained for {base or 'another model'} (hidden size "
                         f"{ad.hidden}), not for {engine.name} (hidden size {engine.model.config.hidden_size}); "
                         f"{hint(engine)}")
    lin = target_linears(engine.model, ad.meta.get("targets", TARGETS))
    for n in ad.names:
        m = lin.get(n)
        a, b = ad.lora_a[n.replace(".", "__")], ad.lora_b[n.replace(".", "__")]
        if m is None or (m.in_features, m.out_features) != (a.shape[1], b.shape[0]):
            raise ValueError(f"the PTP adapter in {where} does not fit {engine.name}: its module {n} has no "
                             f"counterpart of the same shape; {hint(engine)}")


def adapter_for(engine, path=None) -> PTPAdapter | None:
    """The engine's PTP adapter, attached to its model: engine.extras['ptp'] if set (tests, callers), else
    `path`, else <model folder>/ptp/. None when there is none. Loaded adapters are cached in engine.extras."""
    if path:
        cache = engine.extras.setdefault("ptp_paths", {})
        if str(path) not in cache:
            if not (Path(path) / WEIGHTS).exists():
                raise FileNotFoundError(f"no PTP adapter at {path} (expected {WEIGHTS} and {CONFIG})")
            ad = PTPAdapter.load(path, device=engine.device)
            check_fits(ad, engine, path)
            cache[str(path)] = ad
        return cache[str(path)].attach(engine.model)
    ad = engine.extras.get("ptp")
    if ad is None:
        d = default_adapter_dir(engine)
        if d is None or not (d / WEIGHTS).exists():
            return None
        ad = PTPAdapter.load(d, device=engine.device)
        check_fits(ad, engine, d)
        engine.extras["ptp"] = ad
    return ad.attach(engine.model)


def hint(engine) -> str:
    d = model_dir(engine)
    return TRAIN_HINT.format(model=d if d is not None else engine.name)
