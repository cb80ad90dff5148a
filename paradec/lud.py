"""Lexical Unit Decoding, model side: a LoRA adapter gated to padding positions, a learned pad embedding,
and their save / load (Sun et al., LREC-COLING 2024, arXiv 2405.15208).

LUD appends k-1 padding ("mask") slots after the last real token and reads k tokens out of one forward
pass: the last real position gives the ordinary next token, pad slot j gives the token j places further.
Only the pad slots may behave differently from the base model, so the adapter is *gated*:

* every `nn.Linear` of the decoder layers (attention q/k/v/o and the MLP projections by default) gets a
  low-rank delta  B·A·x·(scale)  that is added **only at positions whose gate is on**; at every other
  position the layer's output is the base output, bit for bit (a `torch.where`, not a multiplication);
* the input embedding of a gated position is replaced by one learned vector (the pad embedding), so the
  token id fed at a pad slot does not matter;
* while the adapter is applied the logits get one extra column, index `vocab_size`: the STOP class, a
  learned linear score of the final hidden state at gated positions ("the lexical unit ends here") and
  -inf at real positions (so the real columns and every real token's distribution are unchanged).
  A dedicated class rather than a vocabulary token, because a model's pad token often has a zero or
  untrainable embedding row and cannot be predicted at all.

Real tokens therefore get exactly the base model's hidden states, keys, values and logits - the first token
of every LUD step is the `ar` token - and real tokens never attend to pad slots (causal order: pads come
last), so dropping the pad slots from the KV cache afterwards leaves the cache as `ar` would have it.

Nothing is patched permanently: `adapter.applied(model, gate)` registers forward hooks for one call and
removes them on exit, so the engine's model stays the plain base model for every other strategy.

Files (default folder `<model>/lud/`): `adapter.safetensors` (LoRA A/B per module, `pad_embedding`,
`stop_weight`, `stop_bias`) and
`lud_config.json` (rank, scale, k, alpha, target modules, the base model's shape for a compatibility check,
training figures).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

CONFIG_NAME = "lud_config.json"
WEIGHTS_NAME = "adapter.safetensors"
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
STOP_LABEL_NOTE = "pad-slot label meaning 'the lexical unit ended here' (the tokenizer's pad id)"


class AdapterError(Exception):
    """LUD parameters are missing or do not fit the model; the message says why and what to do."""


@dataclass
class LUDConfig:
    rank: int = 16
    scale: float = 2.0                       # LoRA alpha / rank
    k: int = 4                               # tokens per pass at most (1 real + k-1 pad slots)
    alpha: float = 0.9                       # lexical-unit confidence used to build the training data
    stop_id: int = 0                         # index of the STOP class (= the base vocabulary size)
    targets: list[str] = field(default_factory=lambda: list(DEFAULT_TARGETS))
    base: dict = field(default_factory=dict)  # hidden_size, num_hidden_layers, vocab_size, model_type, name
    training: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict) -> "LUDConfig":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})


def base_signature(model) -> dict:
    c = model.config
    return {"model_type": getattr(c, "model_type", ""), "hidden_size": int(c.hidden_size),
            "num_hidden_layers": int(c.num_hidden_layers), "vocab_size": int(c.vocab_size),
            "name": str(getattr(c, "_name_or_path", "") or "")}


def target_linears(model, targets) -> dict[str, nn.Linear]:
    """{module name: nn.Linear} for the decoder-layer linears whose last name part is in `targets`."""
    out = {}
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and name.rsplit(".", 1)[-1] in targets and re.search(r"\.layers\.\d+\.", name):
            out[name] = mod
    return out


def _key(name: str) -> str:
    return name.replace(".", "__")


class LUDAdapter(nn.Module):
    """The trainable LUD parameters for one base model: gated LoRA pairs plus the pad embedding."""

    def __init__(self, model, config: LUDConfig):
        super().__init__()
        config.stop_id = int(model.get_output_embeddings().weight.shape[0])   # the STOP class index
        self.config = config
        self.names = list(target_linears(model, config.targets))
        if not self.names:
            raise AdapterError(f"the model has no linear layers named {config.targets} inside decoder layers; "
                               "LUD needs a decoder-only transformer")
        mods = target_linears(model, config.targets)
        self.lora_a = nn.ParameterDict()
        self.lora_b = nn.ParameterDict()
        for n in self.names:
            lin = mods[n]
            a = torch.empty(config.rank, lin.in_features)
            nn.init.kaiming_uniform_(a, a=math.sqrt(5))
            self.lora_a[_key(n)] = nn.Parameter(a)
            self.lora_b[_key(n)] = nn.Parameter(torch.zeros(lin.out_features, config.rank))
        emb = model.get_input_embeddings().weight
        # start the pad embedding at the mean token embedding: a neutral, in-distribution input
        self.pad_embedding = nn.Parameter(emb.detach().float().mean(0).clone())
        self.stop_weight = nn.Parameter(torch.zeros(emb.shape[1]))
        self.stop_bias = nn.Parameter(torch.zeros(()))
        self.gate: torch.Tensor | None = None   # (B, T) bool while applied
        self._tail: int | None = None            # n when the gate is exactly the last n positions

    # ------------------------------------------------------------------ hooks
    # The gate of a decoding pass is a suffix (the last n positions); hooks then touch only that slice,
    # in place when no gradient is recorded. Any other gate shape goes through torch.where.
    def _apply_delta(self, output, x, fn):
        tail = self._tail
        if tail is None:
            return torch.where(self.gate.unsqueeze(-1), output + fn(x).to(output.dtype), output)
        n = min(tail, output.shape[1])
        if n == 0:
            return None
        d = fn(x[:, -n:]).to(output.dtype)
        if n == output.shape[1]:
            return output + d
        if not torch.is_grad_enabled():
            output[:, -n:] += d
            return output
        return torch.cat([output[:, :-n], output[:, -n:] + d], 1)

    def _linear_hook(self, name):
        a, b = self.lora_a[_key(name)], self.lora_b[_key(name)]
        scale = self.config.scale

        def delta(x):
            return ((x.to(a.dtype) @ a.t()) * scale) @ b.t()

        def hook(module, inputs, output):
            return self._apply_delta(output, inputs[0], delta)
        return hook

    def _embedding_hook(self, module, inputs, output):
        tail = self._tail
        if tail is None:
            return torch.where(self.gate.unsqueeze(-1), self.pad_embedding.to(output.dtype).expand_as(output), output)
        n = tail
        if n == 0:
            return None
        pad = self.pad_embedding.to(output.dtype).expand(output.shape[0], n, -1)
        if n == output.shape[1]:
            return pad
        if not torch.is_grad_enabled():
            output[:, -n:] = pad
            return output
        return torch.cat([output[:, :-n], pad], 1)

    def _head_hook(self, module, inputs, output):
        h = inputs[0]
        g = self.gate[:, -h.shape[1]:]
        stop = (h.to(self.stop_weight.dtype) @ self.stop_weight + self.stop_bias).to(output.dtype)
        col = torch.where(g, stop, torch.full_like(stop, float("-inf")))
        return torch.cat([output, col.unsqueeze(-1)], -1)

    def _modules_of(self, model) -> list:
        """The hooked linears of `model`, looked up once per model."""
        memo = self.__dict__.setdefault("_mods", {})
        if id(model) not in memo:
            mods = dict(model.named_modules())
            missing = [n for n in self.names if n not in mods]
            if missing:
                raise AdapterError(f"the model has no module {missing[0]}: "
                                   "these LUD parameters belong to another model")
            memo[id(model)] = [mods[n] for n in self.names]
        return memo[id(model)]

    @contextlib.contextmanager
    def applied(self, model, gate: torch.Tensor):
        """Run `model` with the adapter active at the positions where `gate` (B, T) or (T,) is True."""
        gate = torch.as_tensor(gate, dtype=torch.bool)
        gate = gate.unsqueeze(0) if gate.dim() == 1 else gate
        n = int(gate[0].flip(0).cumprod(0).sum())            # trailing gated positions of row 0
        suffix = bool(gate[:, gate.shape[1] - n:].all()) and not bool(gate[:, :gate.shape[1] - n].any())
        self._tail = n if suffix else None
        self.gate = gate.to(self.pad_embedding.device)
        handles = []
        try:
            handles.append(model.get_input_embeddings().register_forward_hook(self._embedding_hook))
            handles.append(model.get_output_embeddings().register_forward_hook(self._head_hook))
            for n_, mod in zip(self.names, self._modules_of(model)):
                handles.append(mod.register_forward_hook(self._linear_hook(n_)))
            yield self
        finally:
            for h in handles:
                h.remove()
            self.gate, self._tail = None, None

    # ------------------------------------------------------------------ save / load
    def save(self, folder, extra_training: dict | None = None) -> Path:
        from safetensors.torch import save_file
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {k: getattr(self, k).detach().float().cpu().contiguous()
                   for k in ("pad_embedding", "stop_weight", "stop_bias")}
        for n in self.names:
            tensors[f"{n}.lora_a"] = self.lora_a[_key(n)].detach().float().cpu().contiguous()
            tensors[f"{n}.lora_b"] = self.lora_b[_key(n)].detach().float().cpu().contiguous()
        tmp = folder / (WEIGHTS_NAME + ".tmp")
        save_file(tensors, str(tmp), metadata={"format": "pt", "kind": "paradec-lud"})
        os.chmod(tmp, 0o644)
        os.replace(tmp, folder / WEIGHTS_NAME)
        cfg = asdict(self.config)
        if extra_training:
            cfg["training"] = {**cfg.get("training", {}), **extra_training}
        (folder / CONFIG_NAME).write_text(json.dumps(cfg, indent=1))
        return folder


def compatible(config: LUDConfig, model) -> str:
    """'' when parameters trained for `config.base` fit `model`, else why not."""
    sig, base = base_signature(model), config.base
    for k in ("hidden_size", "num_hidden_layers", "vocab_size"):
        if k in base and int(base[k]) != sig[k]:
            return (f"these LUD parameters were trained for a model with {k}={base[k]}, "
                    f"but this model has {k}={sig[k]}")
    return ""


def load_adapter(folder, model) -> LUDAdapter:
    """Load LUD parameters from `folder` for `model` (same device and dtype as the model)."""
    from safetensors.torch import load_file
    folder = Path(folder)
    if not (folder / CONFIG_NAME).exists() or not (folder / WEIGHTS_NAME).exists():
        raise AdapterError(f"no LUD parameters in {folder} (expected {CONFIG_NAME} and {WEIGHTS_NAME})")
    config = LUDConfig.from_dict(json.loads((folder / CONFIG_NAME).read_text()))
    why = compatible(config, model)
    if why:
        raise AdapterError(why)
    adapter = LUDAdapter(model, config)
    tensors = load_file(str(folder / WEIGHTS_NAME))
    missing = [n for n in adapter.names if f"{n}.lora_a" not in tensors]
    singles = ("pad_embedding", "stop_weight", "stop_bias")
    missing += [k for k in singles if k not in tensors]
    if missing:
        raise AdapterError(f"{folder / WEIGHTS_NAME} lacks tensors for {missing[:3]}")
    with torch.no_grad():
        for k in singles:
            getattr(adapter, k).copy_(tensors[k])
        for n in adapter.names:
            adapter.lora_a[_key(n)].copy_(tensors[f"{n}.lora_a"])
            adapter.lora_b[_key(n)].copy_(tensors[f"{n}.lora_b"])
    p = next(model.parameters())
    adapter.to(device=p.device, dtype=p.dtype).eval().requires_grad_(False)
    return adapter


def model_folder(engine) -> Path | None:
    """The local folder the engine's model was loaded from, when there is one."""
    path = str(getattr(engine.model.config, "_name_or_path", "") or "")
    return Path(path) if path and os.path.isdir(path) else None


def default_folder(engine) -> Path | None:
    folder = model_folder(engine)
    return folder / "lud" if folder is not None else None


def adapter_for(engine, folder: str | os.PathLike | None = None) -> LUDAdapter:
    """The LUD adapter for `engine`: from `folder` if given, else engine.extras['lud'] (tests may put one
    there), else `<model folder>/lud/`. Loaded adapters are cached in engine.extras."""
    if folder:
        cache = engine.extras.setdefault("lud_by_path", {})
        key = str(Path(folder).resolve())
        if key not in cache:
            cache[key] = load_adapter(folder, engine.model)
        return cache[key]
    if engine.extras.get("lud") is not None:
        return engine.extras["lud"]
    d = default_folder(engine)
    if d is None or not (d / CONFIG_NAME).exists():
        raise AdapterError(f"no LUD parameters for {engine.name}")
    engine.extras["lud"] = load_adapter(d, engine.model)
    return engine.extras["lud"]


def has_adapter(engine) -> bool:
    if engine.extras.get("lud") is not None:
        return True
    d = default_folder(engine)
    return d is not None and (d / CONFIG_NAME).exists() and (d / WEIGHTS_NAME).exists()


def pad_group_mask(n_real: int, cuts: list[int], slots: int, device=None) -> torch.Tensor:
    """Boolean 'may attend' (Q, n_real + Q) for training pad groups after `n_real` cached real tokens.

    Group g (cut point i = cuts[g], i real tokens visible) has `slots` pad slots; slot j of group g sees the
    real tokens 0..i-1 and slots 0..j of its own group, nothing else.
    """
    Q = len(cuts) * slots
    allowed = torch.zeros(Q, n_real + Q, dtype=torch.bool, device=device)
    tri = torch.ones(slots, slots, dtype=torch.bool, device=device).tril()
    for g, i in enumerate(cuts):
        r = slice(g * slots, (g + 1) * slots)
        allowed[r, :i] = True
        allowed[r, n_real + g * slots: n_real + (g + 1) * slots] = tri
    return allowed
