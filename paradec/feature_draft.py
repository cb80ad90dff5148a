"""Feature-level drafts (EAGLE, Li et al. 2024): a one-layer draft that reads the target's own last hidden state.

A token-level draft (paradec/draft.py) must guess the next token from the tokens alone; this draft gets the
target's final hidden state f_j at position j (after the final norm: what the LM head reads) together with the
embedding of the token t_{j+1} that followed it, and predicts the target's next hidden state f_{j+1}:

    f^_{j+1} = norm(layer(fc([f_j ; emb(t_{j+1})])))      logits of t_{j+2} = head(f^_{j+1})

`layer` is one decoder layer of the target's architecture (initialised as a copy of the target's last layer,
with its own causal attention and KV cache over the draft's positions), `fc` a linear map from 2 x hidden to
hidden, `norm` a copy of the target's final norm; the input embeddings and the LM-head rows are the target's
(frozen, taken at load), the head restricted to a trimmed vocabulary as in paradec/draft.py (FR-Spec): full-
vocabulary logits with -inf outside the kept tokens, so q stays a proper distribution and rejection sampling
exact. Drafting k tokens: the first draft pass reads true target features; later passes read the draft's own
f^ (the training teaches both: paradec/training/eagle_train.py).

With `aux_layers` (EAGLE-3's fused features, Li et al. 2025) the true feature of a position also carries what the
target's layers a_1, a_2, ... read there (each one's input norm output: the residual stream after a layers,
normalised as that layer sees it): f_j = [final ; aux_1 ; aux_2 ...], and fc maps (2 + len(aux)) x hidden to hidden.
A predicted f^ has no such parts: they are read as zeros, which is also how the draft is trained on its own
predictions. A draft widened from one without aux layers starts with zero weights on them, so it decodes exactly
as before until trained. The folder holds fc, the layer and the norm (bfloat16) plus the kept ids:

    data/drafts/<target>/eagle/draft.safetensors, draft_config.json, README.md
"""
from __future__ import annotations

import copy
import json
import threading
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from . import draft as D

FORMAT = "paradec-eagle-draft"
SUBDIR = "eagle"


def shipped_dir(target_name: str) -> Path:
    return D.DRAFTS / target_name / SUBDIR


def is_feature_draft_dir(path) -> bool:
    p = Path(path) / D.CONFIG
    if not p.is_file():
        return False
    try:
        return json.loads(p.read_text()).get("format") == FORMAT
    except ValueError:
        return False


@contextmanager
def capture(engine, aux: tuple[int, ...] | list[int] = ()):
    """Within the block, every forward pass of `engine` leaves its final hidden states (B, T, hidden: the final
    norm's output, over every position the pass fed) in the yielded list's last entry; with `aux` layers, followed
    along the last dimension by each of those layers' input norm output (B, T, (1 + len(aux)) x hidden). Hooks on
    norms (not on the model), so the engine's lean pass (paradec/fastpath.py) still runs; hold it around the
    passes that need it only, and only this thread's passes are kept."""
    got: list[torch.Tensor] = []
    parts: dict[int, torch.Tensor] = {}
    me = threading.get_ident()
    dec = D._decoder(engine.model)

    def keep(_m, _i, out):
        if threading.get_ident() == me:      # another thread's pass on the same model is not ours
            got.append(torch.cat([out] + [parts.pop(a) for a in aux], -1) if aux else out)

    def keep_aux(a):
        def hook(_m, _i, out):
            if threading.get_ident() == me:
                parts[a] = out
        return hook
    hooks = [dec.norm.register_forward_hook(keep)]
    hooks += [dec.layers[a].input_layernorm.register_forward_hook(keep_aux(a)) for a in aux]
    try:
        yield got
    finally:
        for h in hooks:
            h.remove()


class _Net(nn.Module):
    def __init__(self, shell, fc):
        super().__init__()
        self.shell = shell
        self.fc = fc


class FeatureDraft:
    """fc + one decoder layer + norm over (target feature, next token embedding) pairs; the target's head rows."""

    def __init__(self, target_engine, net: _Net, kept: list[int], source: int, aux: list[int] | None = None):
        self.target = target_engine
        self.net = net
        self.aux = [int(a) for a in (aux or [])]
        self.kept_ids = torch.tensor(kept, dtype=torch.long)
        self.source = int(source)
        self._to_kept = torch.full((int(target_engine.vocab_size),), -1, dtype=torch.long)
        self._to_kept[self.kept_ids] = torch.arange(len(kept))
        from . import fastpath
        self.lean = fastpath.supports(net.shell)

    # ------------------------------------------------------------ building
    @classmethod
    def _assemble(cls, engine, layer: nn.Module, norm: nn.Module, fc: nn.Linear, kept: list[int],
                  source: int, aux: list[int] | None = None) -> "FeatureDraft":
        shell = D.Draft._shell(engine, 1, layer.mlp.down_proj.in_features)
        dec, tdec = D._decoder(shell), D._decoder(engine.model)
        dec.embed_tokens = tdec.embed_tokens                 # shared, not copied (the token half of the input)
        layer.self_attn.layer_idx = 0
        if hasattr(layer, "layer_idx"):
            layer.layer_idx = 0
        dec.layers = nn.ModuleList([layer])
        dec.norm = norm
        kept_t = torch.tensor(kept, dtype=torch.long)
        rows = engine.model.get_output_embeddings().weight.detach()[kept_t].clone()
        shell.lm_head = D.TrimmedHead(rows, kept_t, engine.vocab_size)
        net = _Net(shell, fc.to(engine.dtype))
        net.to(engine.device).eval()
        return cls(engine, net, kept, source, aux)

    @classmethod
    def from_target(cls, engine, kept: list[int], source: int = -1) -> "FeatureDraft":
        """A new draft: the target's layer `source` and final norm copied, fc initialised so that it passes the
        token embedding through and adds a small share of the feature."""
        tl = D._decoder(engine.model).layers
        layer = copy.deepcopy(tl[source % len(tl)])
        norm = copy.deepcopy(D._decoder(engine.model).norm)
        hsz = int(engine.model.config.hidden_size)
        fc = nn.Linear(2 * hsz, hsz, bias=True, dtype=engine.dtype)
        with torch.no_grad():
            fc.weight.normal_(0.0, 0.02 / hsz ** 0.5)
            fc.weight[:, hsz:] += torch.eye(hsz, dtype=fc.weight.dtype)
            fc.bias.zero_()
        d = cls._assemble(engine, layer, norm, fc, kept, source % len(tl))
        for p in d.trainable():
            p.requires_grad_(True)
        return d

    def widen(self, aux: list[int]) -> "FeatureDraft":
        """Give a draft without aux layers the target layers `aux` as extra inputs (module docstring): fc gains
        zero weights for them, so the draft's outputs are unchanged until it is trained."""
        if self.aux:
            raise ValueError(f"this draft already reads aux layers {self.aux}")
        n = int(self.target.model.config.num_hidden_layers)
        bad = [a for a in aux if not 0 < int(a) < n]
        if bad or len(set(aux)) != len(aux):
            raise ValueError(f"aux layers must be distinct and lie in 1..{n - 1}, got {list(aux)}")
        old, hsz = self.net.fc, int(self.target.model.config.hidden_size)
        fc = nn.Linear((2 + len(aux)) * hsz, hsz, bias=True, dtype=old.weight.dtype, device=old.weight.device)
        with torch.no_grad():
            fc.weight.zero_()
            fc.weight[:, :hsz] = old.weight[:, :hsz]              # the final feature's columns
            fc.weight[:, -hsz:] = old.weight[:, hsz:]             # the token embedding's columns
            fc.bias.copy_(old.bias)
        fc.weight.requires_grad_(old.weight.requires_grad)
        fc.bias.requires_grad_(old.bias.requires_grad)
        self.net.fc = fc
        self.aux = [int(a) for a in aux]
        return self

    # ------------------------------------------------------------ use
    def trainable(self) -> list[nn.Parameter]:
        dec = D._decoder(self.net.shell)
        return list(self.net.fc.parameters()) + list(dec.layers.parameters()) + list(dec.norm.parameters())

    def inputs(self, feats: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """fc([f_j ; emb(t_{j+1})]): feats (B, T, hidden) or, with aux layers, (B, T, (1 + len(aux)) x hidden)
        (a feature of hidden width, a prediction, reads zeros for the aux parts), tokens (B, T) -> (B, T, hidden)."""
        emb = D._decoder(self.net.shell).embed_tokens(tokens.to(feats.device))
        return self.net.fc(torch.cat([self.full(feats).to(emb.dtype), emb], -1))

    def full(self, feats: torch.Tensor) -> torch.Tensor:
        """feats at the draft's input width: a prediction (hidden wide) gets zeros for the aux parts."""
        hsz = self.net.fc.out_features
        if not self.aux or feats.shape[-1] != hsz:
            return feats
        return torch.cat([feats, feats.new_zeros(*feats.shape[:-1], len(self.aux) * hsz)], -1)

    def hidden(self, feats: torch.Tensor, tokens: torch.Tensor, cache=None, positions=None, mask=None
               ) -> torch.Tensor:
        """The predicted next features f^ (B, T, hidden) for the pairs (feats[:, j], tokens[:, j]); with a cache,
        these positions follow the ones it holds (and are added to it). `positions` (B, T) and a 4-D additive
        `mask` over cache + new positions place the pairs elsewhere (the nodes of a draft tree); by default they
        follow the cache causally."""
        x = self.inputs(feats, tokens)
        if self.lean and not torch.is_grad_enabled():
            from . import fastpath
            return fastpath.forward(self.net.shell, embeds=x, cache=cache, positions=positions, mask=mask,
                                    head=False)
        return D._decoder(self.net.shell)(inputs_embeds=x, past_key_values=cache, position_ids=positions,
                                          attention_mask=mask, use_cache=cache is not None).last_hidden_state

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary logits (-inf outside the kept tokens) for hidden states h (..., hidden)."""
        return self.net.shell.lm_head(h)

    def kept_logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.net.shell.lm_head.kept_logits(h)

    def to_kept(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Target token ids -> indices into the kept vocabulary (-1 where the draft cannot propose them)."""
        return self._to_kept.to(token_ids.device)[token_ids]

    def new_cache(self):
        from transformers import DynamicCache
        return DynamicCache(config=self.net.shell.config)

    def prepare(self) -> "FeatureDraft":
        """For decoding: no gradients, and the few-row kernels the target's dtype takes (paradec/kernels.py)."""
        from . import kernels
        for p in self.net.parameters():
            p.requires_grad_(False)
        kernels.apply(self.net, self.target.device, self.target.dtype)
        return self

    # ------------------------------------------------------------ files
    def config_dict(self) -> dict:
        layer = D._decoder(self.net.shell).layers[0]
        return {"format": FORMAT, "version": 1, "base_model": self.target.name,
                "hidden_size": int(self.target.model.config.hidden_size),
                "vocab_size": int(self.target.vocab_size), "source_layer": self.source,
                "intermediate_size": int(layer.mlp.down_proj.in_features), "kept_tokens": len(self.kept_ids),
                "aux_layers": list(self.aux)}

    def state(self) -> dict:
        dec = D._decoder(self.net.shell)
        sd = {f"fc.{k}": v for k, v in self.net.fc.state_dict().items()}
        sd.update({f"layers.{k}": v for k, v in dec.layers.state_dict().items()})
        sd.update({f"norm.{k}": v for k, v in dec.norm.state_dict().items()})
        return {k: v.detach().cpu().clone() for k, v in sd.items()}

    @classmethod
    def from_state(cls, engine, cfg: dict, state: dict, kept: list[int]) -> "FeatureDraft":
        tl = D._decoder(engine.model).layers
        layer = copy.deepcopy(tl[cfg["source_layer"] % len(tl)])
        if cfg["intermediate_size"] < layer.mlp.down_proj.in_features:
            D._prune_mlp(layer.mlp, torch.arange(cfg["intermediate_size"]))
        norm = copy.deepcopy(D._decoder(engine.model).norm)
        hsz = int(engine.model.config.hidden_size)
        aux = [int(a) for a in cfg.get("aux_layers") or []]
        fc = nn.Linear((2 + len(aux)) * hsz, hsz, bias=True, dtype=engine.dtype)
        d = cls._assemble(engine, layer, norm, fc, kept, cfg["source_layer"], aux)
        dec = D._decoder(d.net.shell)

        def part(prefix):
            return {k[len(prefix):]: v.to(engine.dtype) for k, v in state.items() if k.startswith(prefix)}
        d.net.fc.load_state_dict(part("fc."))
        dec.layers.load_state_dict(part("layers."))
        dec.norm.load_state_dict(part("norm."))
        for p in d.trainable():
            p.requires_grad_(True)
        return d

    def save(self, folder, meta: dict | None = None) -> Path:
        return D.save_folder(folder, self.state(), self.kept_ids, {**self.config_dict(), **(meta or {})})


def load(folder, engine) -> FeatureDraft:
    """The feature draft in `folder` for the target `engine`, ready to decode; ValueError (a clear one) when the
    folder holds something else or a draft made for another model."""
    return read(folder, engine).prepare()


def read(folder, engine) -> FeatureDraft:
    """The feature draft in `folder` for `engine`, its parameters trainable (a trainer's starting point; `load`
    prepares it for decoding); `.meta` holds its config."""
    from safetensors.torch import load_file
    folder = Path(folder)
    if not (folder / D.CONFIG).is_file():
        raise ValueError(f"{folder} holds no feature draft ({D.CONFIG} is missing)")
    cfg = json.loads((folder / D.CONFIG).read_text())
    if cfg.get("format") != FORMAT:
        raise ValueError(f"{folder / D.CONFIG} is not a paradec feature (eagle) draft")
    mine = {"base_model": engine.name, "hidden_size": int(engine.model.config.hidden_size),
            "vocab_size": int(engine.vocab_size)}
    for k, v in mine.items():
        if cfg.get(k) != v:
            raise ValueError(f"the eagle draft in {folder} was made for {cfg.get('base_model')} "
                             f"({k} {cfg.get(k)}), not for {engine.name} ({k} {v}); "
                             f"train one: python -m paradec train eagle --model {engine.path or engine.name}")
    state = load_file(str(folder / D.WEIGHTS))
    kept = state.pop("kept_ids").long().tolist()
    d = FeatureDraft.from_state(engine, cfg, state, kept)
    d.meta = cfg
    return d
