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

Nothing is patched: the adapter's forward hooks (paradec/adapters.py) are attached once per model and do
nothing while the gate is closed, so the engine's model stays the plain base model for every other strategy;
`with adapter.gated(gate):` opens it for a pass, `adapter.applied(model, gate)` attaches it for one block.

Files (default folder `<model>/lud/`): `adapter.safetensors` (LoRA A/B per module, `pad_embedding`,
`stop_weight`, `stop_bias`) and
`lud_config.json` (rank, scale, k, alpha, target modules, the base model's shape and, since the shared adapter
base, its weights' fingerprint for a compatibility check, training figures).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from .adapters import AdapterError, GatedAdapter, key, target_linears

CONFIG_NAME = "lud_config.json"
WEIGHTS_NAME = "adapter.safetensors"
FORMAT = "paradec-lud"
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
STOP_LABEL_NOTE = "pad-slot label meaning 'the lexical unit ended here' (the tokenizer's pad id)"
SINGLES = ("pad_embedding", "stop_weight", "stop_bias")


@dataclass
class LUDConfig:
    rank: int = 16
    scale: float = 2.0                       # LoRA alpha / rank
    k: int = 4                               # tokens per pass at most (1 real + k-1 pad slots)
    alpha: float = 0.9                       # lexical-unit confidence used to build the training data
    stop_id: int = 0                         # index of the STOP class (= the base vocabulary size)
    targets: list[str] = field(default_factory=lambda: list(DEFAULT_TARGETS))
    base: dict = field(default_factory=dict)  # hidden_size, num_hidden_layers, vocab_size, model_type, name
    base_fingerprint: str = ""               # paradec.adapters.fingerprint of the base (none in older files)
    training: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict) -> "LUDConfig":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})


class LUDAdapter(GatedAdapter):
    """The trainable LUD parameters for one base model: gated LoRA pairs plus the pad embedding."""

    KIND, WHAT, FORMAT, CONFIG, WEIGHTS = "lud", "LUD parameters", FORMAT, CONFIG_NAME, WEIGHTS_NAME
    UNTAGGED_OK = True             # lud_config.json had no "format" entry before the shared adapter base

    def __init__(self, model, config: LUDConfig):
        super().__init__()
        config.stop_id = int(model.get_output_embeddings().weight.shape[0])   # the STOP class index
        self.config = config
        mods = target_linears(model, config.targets)
        self.names = list(mods)
        if not self.names:
            raise AdapterError(f"the model has no linear layers named {config.targets} inside decoder layers; "
                               "LUD needs a decoder-only transformer")
        self.lora_a = nn.ParameterDict()
        self.lora_b = nn.ParameterDict()
        for n in self.names:
            lin = mods[n]
            a = torch.empty(config.rank, lin.in_features)
            nn.init.kaiming_uniform_(a, a=math.sqrt(5))
            self.lora_a[key(n)] = nn.Parameter(a)
            self.lora_b[key(n)] = nn.Parameter(torch.zeros(lin.out_features, config.rank))
        emb = model.get_input_embeddings().weight
        # start the pad embedding at the mean token embedding: a neutral, in-distribution input
        self.pad_embedding = nn.Parameter(emb.detach().float().mean(0).clone())
        self.stop_weight = nn.Parameter(torch.zeros(emb.shape[1]))
        self.stop_bias = nn.Parameter(torch.zeros(()))

    # ------------------------------------------------------------------ hooks
    # The gate of a decoding pass is a suffix (the last n positions); hooks then touch only that slice,
    # in place when no gradient is recorded. Any other gate shape goes through torch.where.
    def lora_pair(self, name: str):
        return self.lora_a[key(name)], self.lora_b[key(name)], self.config.scale

    def extra_hooks(self, model) -> list:
        return [(model.get_input_embeddings(), self._embedding_hook), (model.get_output_embeddings(), self._head_hook)]

    def _embedding_hook(self, module, inputs, output):
        gate = self._gate
        return None if gate is None else gate.put(output, self.pad_embedding.to(output.dtype))

    def _head_hook(self, module, inputs, output):
        gate = self._gate
        if gate is None:
            return None
        h = inputs[0]
        g = gate.mask[:, -h.shape[1]:]
        stop = (h.to(self.stop_weight.dtype) @ self.stop_weight + self.stop_bias).to(output.dtype)
        col = torch.where(g, stop, torch.full_like(stop, float("-inf")))
        return torch.cat([output, col.unsqueeze(-1)], -1)

    # ------------------------------------------------------------------ files
    def file_config(self) -> dict:
        return {"format": FORMAT, "version": 1, **asdict(self.config)}

    def tensors(self) -> dict[str, torch.Tensor]:
        out = {k: getattr(self, k).detach().float().cpu().contiguous() for k in SINGLES}
        for n in self.names:
            out[f"{n}.lora_a"] = self.lora_a[key(n)].detach().float().cpu().contiguous()
            out[f"{n}.lora_b"] = self.lora_b[key(n)].detach().float().cpu().contiguous()
        return out

    @classmethod
    def file_shapes(cls, cfg: dict, tensors: dict) -> dict[str, tuple[int, int]]:
        return {n[:-7]: (t.shape[1], tensors[n[:-7] + ".lora_b"].shape[0]) for n, t in tensors.items()
                if n.endswith(".lora_a") and n[:-7] + ".lora_b" in tensors}

    @classmethod
    def from_files(cls, cfg: dict, tensors: dict, model=None) -> "LUDAdapter":
        """LUD parameters for `model` (needed: the pad slots' shapes come from it), in its device and dtype."""
        if model is None:
            raise AdapterError("LUD parameters are loaded for a model: pass it")
        adapter = cls(model, LUDConfig.from_dict(cfg))
        missing = [n for n in adapter.names if f"{n}.lora_a" not in tensors]
        missing += [k for k in SINGLES if k not in tensors]
        if missing:
            raise AdapterError(f"the LUD weights file lacks tensors for {missing[:3]}")
        with torch.no_grad():
            for k in SINGLES:
                getattr(adapter, k).copy_(tensors[k])
            for n in adapter.names:
                adapter.lora_a[key(n)].copy_(tensors[f"{n}.lora_a"])
                adapter.lora_b[key(n)].copy_(tensors[f"{n}.lora_b"])
        p = next(model.parameters())
        return adapter.to(device=p.device, dtype=p.dtype).eval().requires_grad_(False)


load_adapter = LUDAdapter.load        # (folder, model): AdapterError when missing or made for another model
adapter_for = LUDAdapter.find         # None when there is none; AdapterError when it does not fit


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
