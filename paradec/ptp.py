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
  with forward hooks on the nn.Linear modules, once per model, and gated by the positions of each forward
  (`adapter.gated(idx)`, paradec/adapters.py): real tokens go through the unchanged base weights (bit for bit -
  nothing is added to their outputs), so one model with one KV cache is verifier and drafter at once.
* Modes: "O" (one-hot PTP, distilled from a teacher): slot k sees u_1..u_k and its argmax is t_k.
  "C" (categorical PTP, teacher-free): slot k sees u_1..u_{k-1} (slot 1 a learned start vector) and predicts
  the distribution of t_k; the draft is Pick(u_k, that distribution).

An adapter lives in a folder: `adapter.safetensors` (the LoRA factors in bfloat16, the rest float32) +
`adapter_config.json`. The default one of a model paradec ships for is in data/adapters/<model>/ptp/ (the
provisioned model folder is not part of the repository); any other model's is `<model>/ptp/`. An adapter
records the model it was trained for (name, signature, weights' fingerprint) and refuses another.
"""
from __future__ import annotations

import torch
from torch import nn

from .adapters import AdapterError, GatedAdapter, base_record, fingerprint, key, target_linears  # noqa: F401

FORMAT = "paradec-ptp"
VERSION = 1
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
WEIGHTS = "adapter.safetensors"
CONFIG = "adapter_config.json"

_BITS = torch.arange(32, dtype=torch.int32)


def u_bits(u) -> torch.Tensor:
    """u (...,) in [0, 1) -> (..., 32) float 0/1: the IEEE-754 bits of u as float32, least significant first."""
    u = torch.as_tensor(u, dtype=torch.float32).contiguous()
    i = u.view(torch.int32)
    return ((i.unsqueeze(-1) >> _BITS.to(i.device)) & 1).float()


class PTPAdapter(GatedAdapter):
    """u embedding + gated LoRA for one base model. Parameters stay float32 whatever the model's dtype."""

    KIND, WHAT, FORMAT, CONFIG, WEIGHTS = "ptp", "PTP adapter", FORMAT, CONFIG, WEIGHTS
    NAME_CHECK = True            # adapters from before the fingerprint: the recorded model name must match

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
            self.lora_a[key(n)] = nn.Parameter(torch.randn(rank, fan_in) / fan_in ** 0.5)
            self.lora_b[key(n)] = nn.Parameter(torch.zeros(fan_out, rank))

    @property
    def _idx(self):
        """The open gate (None: closed)."""
        return self._gate

    # ------------------------------------------------------------ building
    @classmethod
    def for_model(cls, model, rank: int = 32, block: int = 16, mode: str = "O", alpha=None, targets=TARGETS,
                  meta=None, init_from_embeddings: bool = True) -> "PTPAdapter":
        lin = target_linears(model, targets)
        if not lin:
            raise AdapterError(f"no linear layers named {', '.join(targets)} in {type(model).__name__}: "
                               "PTP needs a Llama-style model")
        shapes = {n: (m.in_features, m.out_features) for n, m in lin.items()}
        ad = cls(int(model.config.hidden_size), shapes, rank=rank, alpha=alpha, block=block, mode=mode,
                 meta={**base_record(model), **(meta or {})})
        if init_from_embeddings:     # start the u slots in the region of the model's input space
            with torch.no_grad():
                emb = model.get_input_embeddings().weight.float()
                ad.u_base.copy_(emb.mean(0).cpu())
        ad.meta.setdefault("targets", list(targets))
        ad.to(next(model.parameters()).device)
        return ad

    def file_config(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "hidden_size": self.hidden, "rank": self.rank,
                "alpha": self.alpha, "block": self.block, "mode": self.mode, "modules": self.names,
                "u_embedding": "float32 bits -> Linear(32, hidden) + base + mode vector", **self.meta}

    @classmethod
    def recorded_in(cls, cfg: dict) -> dict:
        return {**super().recorded_in(cfg), "hidden_size": cfg.get("hidden_size"), "name": cfg.get("base_model")}

    # ------------------------------------------------------------ the gated LoRA
    def lora_pair(self, name: str):
        return self.lora_a[key(name)], self.lora_b[key(name)], self.scale

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
    def tensors(self) -> dict[str, torch.Tensor]:
        # LoRA factors in bfloat16 (rank 32 on a 0.5B model: 35 MB instead of 70), the small rest float32
        return {k: v.detach().cpu().to(torch.bfloat16 if k.startswith("lora_") else torch.float32).contiguous()
                for k, v in self.state_dict().items()}

    @classmethod
    def file_shapes(cls, cfg: dict, state: dict) -> dict[str, tuple[int, int]]:
        return {n: (state[f"lora_a.{key(n)}"].shape[1], state[f"lora_b.{key(n)}"].shape[0]) for n in cfg["modules"]}

    @classmethod
    def from_files(cls, cfg: dict, state: dict, model=None) -> "PTPAdapter":
        shapes = cls.file_shapes(cfg, state)
        known = {"format", "version", "hidden_size", "rank", "alpha", "block", "mode", "modules", "u_embedding"}
        ad = cls(cfg["hidden_size"], shapes, rank=cfg["rank"], alpha=cfg["alpha"], block=cfg["block"],
                 mode=cfg["mode"], meta={k: v for k, v in cfg.items() if k not in known})
        ad.load_state_dict({k: v.float() for k, v in state.items()})
        return ad


# ---------------------------------------------------------------- finding an engine's adapter
adapter_for = PTPAdapter.find                   # None when there is none; AdapterError when it does not fit
default_adapter_dir = PTPAdapter.default_dir
hint = PTPAdapter.hint
