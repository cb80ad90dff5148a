"""Distilled draft models that share their target's embeddings (trained by paradec.training.draft_distill).

A draft is a short stack of decoder layers copied from the target (e.g. its first and last), their MLPs pruned
to the neurons most active on the target's own answers, the target's final norm, and an LM head restricted to
a trimmed vocabulary (FR-Spec, ACL 2025): the rows of the target's LM head for the tokens the target emits
most. Input embeddings and head rows are the target's, taken when the draft is loaded, so the folder holds only
the layers and the norm (bfloat16) plus the kept token ids:

    data/drafts/<target>/draft.safetensors, draft_config.json, README.md

At load time the draft becomes an ordinary transformers model object (the target's architecture with
len(layers) layers) wrapped in a paradec Engine with the target's tokenizer, so `sps` and transformers'
assisted generation (`hf-assisted`) use the very same draft. Its head returns logits over the FULL vocabulary
with -inf outside the kept tokens: softmax gives them probability exactly 0, so the draft's q is a proper
distribution over the target's vocabulary and rejection sampling stays exact (a draft that never proposes a
token is fine).
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
DRAFTS = ROOT / "data" / "drafts"
FORMAT = "paradec-draft"
WEIGHTS = "draft.safetensors"
CONFIG = "draft_config.json"


def shipped_dir(target_name: str) -> Path:
    return DRAFTS / target_name


def is_draft_dir(path) -> bool:
    return (Path(path) / CONFIG).is_file()


class TrimmedHead(nn.Module):
    """LM head over `kept` token ids only; returns full-vocabulary logits with -inf elsewhere. Its rows are an
    nn.Linear (`proj`, frozen) so that `kernels.apply` gives the head the same few-row kernel as the draft's other
    linears (on a Zen 1 EPYC in float32, 16384 rows x 3 inputs: 2.2 ms native against 12.5 ms streamed)."""

    def __init__(self, weight_rows: torch.Tensor, kept: torch.Tensor, vocab: int):
        super().__init__()
        self.proj = nn.Linear(weight_rows.shape[1], weight_rows.shape[0], bias=False, device="meta")
        self.proj.weight = nn.Parameter(weight_rows, requires_grad=False)
        self.register_buffer("kept", kept.long(), persistent=False)
        self.vocab = int(vocab)

    @property
    def weight(self) -> torch.Tensor:
        return self.proj.weight

    def kept_logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.proj(h)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        small = self.kept_logits(h)
        out = small.new_full((*small.shape[:-1], self.vocab), float("-inf"))
        return out.index_copy_(-1, self.kept, small)


def _decoder(model):
    return model.model


def _prune_mlp(mlp, keep: torch.Tensor) -> None:
    """Keep the MLP neurons `keep` (indices into the intermediate dimension), in place."""
    for name in ("gate_proj", "up_proj"):
        lin = getattr(mlp, name)
        new = nn.Linear(lin.in_features, len(keep), bias=lin.bias is not None, dtype=lin.weight.dtype)
        new.weight.data = lin.weight.data[keep].clone()
        if lin.bias is not None:
            new.bias.data = lin.bias.data[keep].clone()
        setattr(mlp, name, new)
    down = mlp.down_proj
    new = nn.Linear(len(keep), down.out_features, bias=down.bias is not None, dtype=down.weight.dtype)
    new.weight.data = down.weight.data[:, keep].clone()
    if down.bias is not None:
        new.bias.data = down.bias.data.clone()
    mlp.down_proj = new
    if hasattr(mlp, "intermediate_size"):
        mlp.intermediate_size = len(keep)


class Draft:
    """The draft as a transformers model sharing the target's embeddings, plus its trimmed head."""

    def __init__(self, target_engine, model, kept: list[int], sources: list[int]):
        self.target = target_engine
        self.model = model
        self.kept_ids = torch.tensor(kept, dtype=torch.long)
        self.sources = list(sources)
        self._to_kept = torch.full((int(target_engine.vocab_size),), -1, dtype=torch.long)
        self._to_kept[self.kept_ids] = torch.arange(len(kept))

    # ------------------------------------------------------------ building
    @staticmethod
    def _shell(engine, n_layers: int, intermediate: int):
        """A model of the target's architecture with n_layers layers and a 16-token vocabulary (replaced)."""
        from transformers import AutoModelForCausalLM
        cfg = copy.deepcopy(engine.model.config)
        cfg.num_hidden_layers = n_layers
        cfg.intermediate_size = intermediate
        if getattr(cfg, "layer_types", None):
            cfg.layer_types = [cfg.layer_types[0]] * n_layers
        if hasattr(cfg, "max_window_layers"):
            cfg.max_window_layers = n_layers
        vocab = cfg.vocab_size
        cfg.vocab_size = 16
        pad = getattr(cfg, "pad_token_id", None)
        cfg.pad_token_id = None            # the shell's own 16-row embedding is replaced by the target's
        cfg.tie_word_embeddings = False
        model = AutoModelForCausalLM.from_config(cfg, dtype=engine.dtype)
        model.config.vocab_size = vocab
        model.config.pad_token_id = pad
        return model

    @classmethod
    def _assemble(cls, engine, layers: list[nn.Module], norm: nn.Module, kept: list[int], sources) -> "Draft":
        inter = layers[0].mlp.down_proj.in_features
        model = cls._shell(engine, len(layers), inter)
        dec, tdec = _decoder(model), _decoder(engine.model)
        dec.embed_tokens = tdec.embed_tokens                 # shared, not copied
        for i, layer in enumerate(layers):
            layer.self_attn.layer_idx = i
            if hasattr(layer, "layer_idx"):
                layer.layer_idx = i
        dec.layers = nn.ModuleList(layers)
        dec.norm = norm
        kept_t = torch.tensor(kept, dtype=torch.long)
        rows = engine.model.get_output_embeddings().weight.detach()[kept_t].clone()
        model.lm_head = TrimmedHead(rows, kept_t, engine.vocab_size)
        model.to(engine.device).eval()
        from . import kernels
        kernels.apply(model, engine.device, engine.dtype)
        return cls(engine, model, kept, sources)

    @classmethod
    def from_target(cls, engine, sources: list[int], intermediate: int, kept: list[int],
                    calib: list[torch.Tensor]) -> "Draft":
        """Copy target layers `sources` (negative = from the end), prune each MLP to the `intermediate` neurons
        with the largest mean |act(gate) * up| * ||down column|| over the calibration rows."""
        tl = _decoder(engine.model).layers
        n = len(tl)
        sources = [s % n for s in sources]
        score = {s: torch.zeros(tl[s].mlp.down_proj.in_features, device=engine.device) for s in sources}
        hooks = []
        for s in sources:
            mlp = tl[s].mlp

            def hook(mod, inputs, _out, s=s):
                x = inputs[0].reshape(-1, inputs[0].shape[-1]).float()
                a = mod.act_fn(x @ mod.gate_proj.weight.float().T) * (x @ mod.up_proj.weight.float().T)
                score[s] += a.abs().mean(0) * mod.down_proj.weight.float().norm(dim=0)
            hooks.append(mlp.register_forward_hook(hook))
        try:
            with torch.no_grad():
                for ids in calib:
                    engine.model(input_ids=ids.to(engine.device), use_cache=False, logits_to_keep=1)
        finally:
            for h in hooks:
                h.remove()
        layers = []
        for s in sources:
            layer = copy.deepcopy(tl[s])
            if intermediate < layer.mlp.down_proj.in_features:
                keep = score[s].topk(intermediate).indices.sort().values
                _prune_mlp(layer.mlp, keep)
            layers.append(layer)
        norm = copy.deepcopy(_decoder(engine.model).norm)
        d = cls._assemble(engine, layers, norm, kept, sources)
        for p in d.trainable():
            p.requires_grad_(True)
        return d

    # ------------------------------------------------------------ use
    def trainable(self) -> list[nn.Parameter]:
        dec = _decoder(self.model)
        return [p for p in list(dec.layers.parameters()) + list(dec.norm.parameters())]

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        return _decoder(self.model)(input_ids=ids.to(self.target.device), use_cache=False).last_hidden_state

    def kept_logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head.kept_logits(h)

    def to_kept(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Target token ids -> indices into the kept vocabulary (-1 where the draft cannot propose them)."""
        return self._to_kept.to(token_ids.device)[token_ids]

    def engine(self):
        from .engine import Engine
        e = Engine(self.model, self.target.tokenizer, name=f"{self.target.name}-draft")
        e.eos_ids = set(self.target.eos_ids)
        return e

    # ------------------------------------------------------------ files
    def config_dict(self) -> dict:
        layers = _decoder(self.model).layers
        return {"format": FORMAT, "version": 1, "base_model": self.target.name,
                "hidden_size": int(self.model.config.hidden_size), "vocab_size": int(self.target.vocab_size),
                "source_layers": self.sources, "layers": len(layers),
                "intermediate_size": int(layers[0].mlp.down_proj.in_features), "kept_tokens": len(self.kept_ids)}

    def state(self) -> dict:
        dec = _decoder(self.model)
        sd = {f"layers.{k}": v for k, v in dec.layers.state_dict().items()}
        sd.update({f"norm.{k}": v for k, v in dec.norm.state_dict().items()})
        return {k: v.detach().cpu().clone() for k, v in sd.items()}

    @classmethod
    def from_state(cls, engine, cfg: dict, state: dict, kept: list[int]) -> "Draft":
        tl = _decoder(engine.model).layers
        layers = []
        for s in cfg["source_layers"]:
            layer = copy.deepcopy(tl[s % len(tl)])
            keep = torch.arange(cfg["intermediate_size"])
            if cfg["intermediate_size"] < layer.mlp.down_proj.in_features:
                _prune_mlp(layer.mlp, keep)
            layers.append(layer)
        norm = copy.deepcopy(_decoder(engine.model).norm)
        d = cls._assemble(engine, layers, norm, kept, cfg["source_layers"])
        dec = _decoder(d.model)
        dec.layers.load_state_dict({k[len("layers."):]: v.to(engine.dtype) for k, v in state.items()
                                    if k.startswith("layers.")})
        dec.norm.load_state_dict({k[len("norm."):]: v.to(engine.dtype) for k, v in state.items()
                                  if k.startswith("norm.")})
        for p in d.trainable():
            p.requires_grad_(True)
        return d

    def save(self, folder, meta: dict | None = None) -> Path:
        return save_folder(folder, self.state(), self.kept_ids, {**self.config_dict(), **(meta or {})})


def save_folder(folder, state: dict, kept_ids: torch.Tensor, config: dict) -> Path:
    """A draft folder: the trained tensors (bfloat16) and the kept token ids in draft.safetensors (written to a
    temporary name, then renamed), the config (its "format" also in the file's metadata) in draft_config.json."""
    from safetensors.torch import save_file
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    st = {k: v.to(torch.bfloat16).contiguous() for k, v in state.items()}
    st["kept_ids"] = kept_ids.to(torch.int32)
    tmp = folder / (WEIGHTS + ".tmp")
    save_file(st, str(tmp), metadata={"format": config["format"]})
    tmp.replace(folder / WEIGHTS)
    (folder / CONFIG).write_text(json.dumps(config, indent=1, default=str) + "\n")
    return folder


def load(folder, engine) -> Draft:
    """The draft in `folder` for the target `engine`; ValueError (a clear one) when it was made for another."""
    from safetensors.torch import load_file
    folder = Path(folder)
    cfg = json.loads((folder / CONFIG).read_text())
    if cfg.get("format") != FORMAT:
        raise ValueError(f"{folder / CONFIG} is not a paradec draft")
    mine = {"base_model": engine.name, "hidden_size": int(engine.model.config.hidden_size),
            "vocab_size": int(engine.vocab_size)}
    for k, v in mine.items():
        if cfg.get(k) != v:
            raise ValueError(f"the draft in {folder} was made for {cfg.get('base_model')} "
                             f"({k} {cfg.get(k)}), not for {engine.name} ({k} {v}); "
                             f"train one: python -m paradec train draft --model {engine.path or engine.name}")
    state = load_file(str(folder / WEIGHTS))
    kept = state.pop("kept_ids").long().tolist()
    d = Draft.from_state(engine, cfg, state, kept)
    for p in d.model.parameters():
        p.requires_grad_(False)
    d.meta = cfg
    return d
