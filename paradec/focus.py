"""FocusLLM (Li et al., arXiv 2408.11745), model side: candidate-token projections, the batched candidate
pass, and the local-context cache built from the candidates.

A long input is split into a *memory* (everything before the final question) and a short *local context*
(the question and, later, the answer). The memory is cut into chunks that fit the model's context and
encoded ONCE as one batch, every chunk with positions restarting at 0 (the same encoding as `pcw`).

Candidate pass (one batched forward, one row per chunk): the last `dynamic` tokens of the local context
(the *dynamic prompt*) are appended to every chunk's cache. The dynamic prompt's last position is the
chunk's *candidate token*: at that position only, the attention q/k/v/o projections of every layer are
the base projections plus a trainable delta, full-rank as in the paper or a rank-r product B A (zero at
initialisation either way, i.e. new projections initialised from the originals); every other position, and
everything else (embeddings, MLPs, norms, head), is the frozen base model. So the candidate's query decides what to read from its chunk, and its
keys/values - one per layer per chunk - carry what it found. (The last layer's q and o deltas are left out
unless training asks for them: they cannot change a key or value the local context reads.)

Local pass: the candidates' per-layer keys/values form the start of the local context's cache, at
positions 0..n-1 (their keys are re-rotated from their position in the chunk to these positions: RoPE
rotations compose, so rotating by the difference is exact); the local context follows at positions n,
n+1, ... and predicts the next token with the frozen model, attending to the n candidates and to itself.
Attention cost: n * (L/n)^2 for the memory instead of L^2, and the memory is encoded once per request.

Where FocusLLM's public code runs the chunks one after another, here they are one batch, both when the
memory is encoded and in every candidate pass.

Candidates are computed once from the prompt's dynamic prompt and kept while the answer is generated
(`refresh` = 0, the regime the shipped parameters are trained for); `refresh` = k recomputes them from
the latest dynamic prompt every k generated tokens (the paper's per-token scheme when k = 1), which
re-encodes the local context each time.

The deltas are a gated adapter (paradec/adapters.py) whose gate is the last position of a pass: attached
once per model, active only inside `adapter.applied(model)` / `adapter.gated()`. The cache work (batch
expansion, reading each layer's keys and values, a cache built from the candidates) goes through the engine.

Files (default folder `<model>/focus/`): `adapter.safetensors` (one delta matrix per projection, or with a `rank`
r > 0 one rank-r pair B A: `lora_a` (r, in), `lora_b` (out, r)) and
`focus_config.json` (dynamic prompt length, the base model's shape and, since the shared adapter base, its
weights' fingerprint for a compatibility check, training figures).
"""
from __future__ import annotations

import re

import torch
from torch import nn

from .adapters import AdapterError, GatedAdapter, base_record, key, target_linears

FORMAT = "paradec-focus"
VERSION = 1
WEIGHTS = "adapter.safetensors"
CONFIG = "focus_config.json"
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


class FocusAdapter(GatedAdapter):
    """One trainable delta per attention projection, applied only at the last position of a forward pass."""

    KIND, WHAT, FORMAT, CONFIG, WEIGHTS = "focus", "FocusLLM parameters", FORMAT, CONFIG, WEIGHTS
    DEFAULT_GATE = 1               # the candidate token: the last position of every forward inside the gate

    def __init__(self, shapes: dict[str, tuple[int, int]], dynamic: int = 16, meta: dict | None = None,
                 rank: int = 0):
        super().__init__()
        self.names = sorted(shapes)
        self.dynamic = int(dynamic)
        self.rank = int(rank)
        self.meta = dict(meta or {})
        if self.rank:
            # low rank: delta = B A (B zero at the start, so the candidates start as the base projections); the
            # full-rank deltas of a 0.5B model would be 176 MB, rank 32 is 17 MB
            self.lora_a = nn.ParameterDict({key(n): nn.Parameter(torch.randn(self.rank, i) / i ** 0.5)
                                            for n, (i, o) in shapes.items()})
            self.lora_b = nn.ParameterDict({key(n): nn.Parameter(torch.zeros(o, self.rank))
                                            for n, (i, o) in shapes.items()})
        else:
            self.delta = nn.ParameterDict({key(n): nn.Parameter(torch.zeros(o, i)) for n, (i, o) in shapes.items()})

    @classmethod
    def for_model(cls, model, dynamic: int = 16, meta: dict | None = None, all_layers: bool = False,
                  rank: int = 0) -> "FocusAdapter":
        """Deltas for every attention projection, except (unless `all_layers`) the last layer's q and o, which
        cannot change any key or value the local context reads (they only shape the candidate's own output,
        which the training's optional candidate loss reads). `rank` 0: full-rank deltas; r > 0: rank-r pairs."""
        lin = target_linears(model, PROJECTIONS)
        if len(lin) < 4:
            raise AdapterError(f"{type(model).__name__} has no attention projections named {', '.join(PROJECTIONS)} "
                               "inside decoder layers; FocusLLM here needs a Llama-style model")
        # the last layer's q and o projections cannot change any key or value the local context reads
        last = max(int(re.search(r"\.layers\.(\d+)\.", n).group(1)) for n in lin)
        if not all_layers:
            lin = {n: m for n, m in lin.items() if not (f".layers.{last}." in n and n.endswith(("q_proj", "o_proj")))}
        ad = cls({n: (m.in_features, m.out_features) for n, m in lin.items()}, dynamic,
                 {**base_record(model), **(meta or {})}, rank=rank)
        return ad.to(next(model.parameters()).device)

    def lora_pair(self, name: str):
        return super().lora_pair(name) if self.rank else None      # full-rank deltas: `delta_for`

    def delta_for(self, name: str):
        if self.rank:
            return super().delta_for(name)
        w = self.delta[key(name)]

        def fn(x):
            return x.to(w.dtype) @ w.t()
        return fn

    # ------------------------------------------------------------------ files
    def file_config(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "dynamic": self.dynamic, "rank": self.rank,
                "modules": self.names, **self.meta}

    def shapes(self) -> dict[str, tuple[int, int]]:
        if self.rank:
            return super().shapes()
        return {n: tuple(self.delta[key(n)].shape[::-1]) for n in self.names}

    def tensors(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().float().cpu().contiguous() for k, v in self.state_dict().items()}

    @classmethod
    def file_shapes(cls, cfg: dict, state: dict) -> dict[str, tuple[int, int]]:
        if cfg.get("rank"):
            return {n: (state[f"lora_a.{key(n)}"].shape[1], state[f"lora_b.{key(n)}"].shape[0])
                    for n in cfg["modules"]}
        return {n: tuple(state[f"delta.{key(n)}"].shape[::-1]) for n in cfg["modules"]}

    @classmethod
    def from_files(cls, cfg: dict, state: dict, model=None) -> "FocusAdapter":
        shapes = cls.file_shapes(cfg, state)
        meta = {k: v for k, v in cfg.items() if k not in ("format", "version", "dynamic", "modules", "rank")}
        ad = cls(shapes, cfg["dynamic"], meta, rank=int(cfg.get("rank") or 0))
        ad.load_state_dict(state)
        return ad.requires_grad_(False)


# ---------------------------------------------------------------------- the passes

def _decoder(model):
    return model.get_decoder() if hasattr(model, "get_decoder") else model.model


def rerotate(model, keys: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """Keys (B, H, T, D) already rotated by RoPE, rotated further by `delta` (B, T) positions."""
    rot = _decoder(model).rotary_emb
    cos, sin = rot(keys, delta.to(keys.device))          # (B, T, D), times the rope's attention scaling
    scale = float(getattr(rot, "attention_scaling", 1.0) or 1.0)
    cos, sin = (cos / scale).unsqueeze(1).to(keys.dtype), (sin / scale).unsqueeze(1).to(keys.dtype)
    half = keys.shape[-1] // 2
    rotated_half = torch.cat([-keys[..., half:], keys[..., :half]], -1)
    return keys * cos + rotated_half * sin


def candidate_pass(engine, adapter: FocusAdapter, chunk_cache, chunk_mask: torch.Tensor | None,
                   chunk_next: torch.Tensor, dynamic: torch.Tensor, groups: int = 1, want_logits: bool = False,
                   offset: int = 0):
    """One batched forward of the dynamic prompts after the chunks: returns [(k, v)] per layer, each
    (groups, H, n, D) with keys re-rotated to positions offset..offset+n-1, n = chunks per group (`offset`: the
    length of the sink before them).

    chunk_cache: batch of R = groups * n rows (group-major); chunk_mask (R, T) of real chunk positions or None
    (no padding); chunk_next (R,) the first free position of each row; dynamic (R, d) token ids.
    The chunk cache is restored to its length before returning (the dynamic prompts are cropped off).
    With `want_logits`, returns (that list, the candidates' own next-token logits (R, V)).
    Under inference mode (decoding) the pass goes through `engine.forward`; outside it (training and its
    evaluation) through the model itself, whose cache tensors autograd may then use."""
    model = engine.model
    R, d = dynamic.shape
    T = engine.cache_len(chunk_cache)
    pos = chunk_next.view(-1, 1).to(engine.device) + torch.arange(d, device=engine.device)
    mask = None
    if chunk_mask is not None:
        full = torch.cat([chunk_mask, torch.ones((R, d), dtype=chunk_mask.dtype, device=engine.device)], 1)
        mask = engine.batch_mask(full, d)
    dynamic = dynamic.to(engine.device)
    if torch.is_inference_mode_enabled():
        def run(ids, positions, m):
            return engine.forward(ids, chunk_cache, positions, m, logits_to_keep=1)
    else:
        def run(ids, positions, m):
            return model(input_ids=ids, past_key_values=chunk_cache, position_ids=positions, attention_mask=m,
                         use_cache=True, logits_to_keep=1).logits
        if torch.is_grad_enabled() and d > 1:
            # training: the dynamic prompt before the candidate does not depend on the trained deltas, so it
            # runs without a graph and only the candidate position is differentiated
            with torch.no_grad():
                run(dynamic[:, :-1], pos[:, :-1], mask[..., :-1, :-1] if mask is not None else None)
            dynamic, pos = dynamic[:, -1:], pos[:, -1:]
            mask = mask[..., -1:, :] if mask is not None else None
    with adapter.applied(model):
        logits = run(dynamic, pos, mask)
    n = R // groups
    target = offset + torch.arange(n, device=engine.device).repeat(groups)   # each group's chunks: 0..n-1 + offset
    shift = (target - pos[:, -1]).view(R, 1)
    out = []
    for keys, values in engine.cache_kv(chunk_cache):
        k = rerotate(model, keys[:, :, -1:], shift)                          # (R, H, 1, D)
        v = values[:, :, -1:]
        H, D = k.shape[1], k.shape[-1]
        out.append((k.view(groups, n, H, D).transpose(1, 2), v.reshape(groups, n, H, v.shape[-1]).transpose(1, 2)))
    engine.crop(chunk_cache, T)
    return (out, logits[:, -1].float()) if want_logits else out


def local_cache(engine, candidates, sink=None):
    """A cache holding the sink's keys/values (positions 0..s-1, when given) then the candidates' (s..s+n-1),
    ready for the local context."""
    if sink:
        candidates = [(torch.cat([sk.expand(k.shape[0], -1, -1, -1), k], 2),
                       torch.cat([sv.expand(v.shape[0], -1, -1, -1), v], 2)) for (sk, sv), (k, v) in zip(sink, candidates)]
    return engine.cache_from_kv(candidates)


def sink_kv(engine, ids: list[int]):
    """Per-layer (keys, values) (1, H, s, D) of `ids` encoded alone by the frozen model at positions 0..s-1: the
    *sink* that starts the local context. A model keeps a large share of every query's attention on the first
    tokens of its input (the "attention sink"); a candidate token is no such token, so without a sink the local
    context opens on n candidates it has never seen the like of (held-out loss 5.8 nats against 3.6 with no
    memory at all, untrained deltas, the default model). None when `ids` is empty."""
    if not ids:
        return None
    cache = engine.new_cache()
    with torch.no_grad():
        engine.model(input_ids=torch.tensor([ids], device=engine.device), past_key_values=cache, use_cache=True,
                     logits_to_keep=1)
    return [(k, v) for k, v in engine.cache_kv(cache)]


def chat_frame(engine) -> tuple[list[int], list[int]]:
    """(head, tail): the tokens every chat prompt of this model starts with (its system turn and the opening of
    the user turn) and ends with (the close of the user turn and the opening of the assistant's), found as the
    common prefix and suffix of two one-word conversations; ([], []) without a chat template. The head is the sink
    the trainer puts before the candidates, as a chat prompt's own opening is at inference."""
    if not getattr(engine, "has_chat_template", False):
        return [], []
    a = engine.encode_messages([{"role": "user", "content": "alpha"}], "")
    b = engine.encode_messages([{"role": "user", "content": "omega"}], "")
    h = t = 0
    while h < min(len(a), len(b)) and a[h] == b[h]:
        h += 1
    while t < min(len(a), len(b)) - h and a[-1 - t] == b[-1 - t]:
        t += 1
    return a[:h], a[len(a) - t:]


def dynamic_prompt(tokens: list[int], dynamic: int, tail: list[int]) -> list[int]:
    """The last `dynamic` tokens of the local context, leaving out the chat template's closing `tail` when the
    context ends with it: those tokens are the same in every chat prompt, so they would spend the dynamic prompt on
    nothing a chunk could be searched for (the trainer's dynamic prompts are plain text)."""
    if tail and len(tokens) > len(tail) and tokens[-len(tail):] == tail:
        tokens = tokens[:-len(tail)]
    return tokens[-dynamic:]


# ---------------------------------------------------------------------- finding an engine's parameters
adapter_for = FocusAdapter.find              # None when there are none; AdapterError when they do not fit
hint = FocusAdapter.hint
