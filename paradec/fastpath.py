"""A lean forward pass for Llama-style decoders (Qwen2, Llama): the same modules and the same operations in the
same order as transformers' forward, without its per-call machinery.

A one-token pass of Qwen2.5-Coder-0.5B in bf16 on 2 CPU cores spent about 38 ms in its linears and 15 ms around
them: output-recording decorators, config-default merging, gradient-checkpointing wrappers, the attention
interface's lookups, a causal mask built for a single row, the output dataclasses (torch profiler and
perf_counter, AMD EPYC, 2026-12-04). Every strategy pays that per pass, and `ar`, which makes one pass per token,
pays it most. `forward` below walks the decoder itself:

- every submodule is still called as a module (norms, each linear, the embedding, the head), so what paradec
  hangs on them keeps working: packed and stacked bf16 weights (paradec/kernels.py), CUDA fixed rows, PTP's and
  LUD's gated LoRA hooks, LUD's embedding and head hooks - except where a gated adapter's deltas can be added
  by the pass itself (`adapters.fused`: bf16 on a CPU, batch 1, a few gated tail rows): then each decoder linear's
  own forward runs and the pass adds the deltas, the same numbers without the hooks' Python;
- attention is `attention.exact_attention`, the function transformers would call through the interface, with
  the mask transformers would build (`create_causal_mask`, once per pass); a one-row pass with no mask of its
  own gets no mask, where transformers adds an all-zero one (adding zeros changes no number);
- rotary embedding, residual sums and the activation are the same tensor operations.

So its logits and cache are transformers' bit for bit (tests/test_fastpath.py checks one-token, many-row, tree-
masked, batched and embedding-input passes against the model's own forward). `supports` says whether a model
is one it knows: the architecture names below, full attention in every layer, the default rotary embedding,
paradec's exact attention, no extra norms; anything else goes through transformers (`Engine.forward`).
`PARADEC_FASTPATH=0` turns it off."""
from __future__ import annotations

import os

import torch

from . import adapters, attention

ARCHITECTURES = ("qwen2", "llama")


def supports(model) -> bool:
    """Whether `forward` computes `model`'s pass exactly as transformers does."""
    if os.environ.get("PARADEC_FASTPATH", "1") in ("0", "false", "False"):
        return False
    cfg = getattr(model, "config", None)
    inner = getattr(model, "model", None)
    if cfg is None or inner is None or getattr(cfg, "model_type", None) not in ARCHITECTURES:
        return False
    if getattr(cfg, "_attn_implementation", None) != attention.NAME:
        return False
    if any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or [])):
        return False
    rot = getattr(inner, "rotary_emb", None)
    if rot is None or getattr(rot, "rope_type", None) != "default" or getattr(rot, "attention_scaling", 1.0) != 1.0:
        return False
    if not hasattr(model, "lm_head") or not all(hasattr(inner, n) for n in ("embed_tokens", "layers", "norm")):
        return False
    for layer in inner.layers:
        a, m = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if a is None or m is None or not all(hasattr(layer, n) for n in ("input_layernorm", "post_attention_layernorm")):
            return False
        if not all(hasattr(a, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling")):
            return False
        if any(hasattr(a, n) for n in ("q_norm", "k_norm")) or getattr(a, "sliding_window", None):
            return False
        if not all(hasattr(m, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            return False
    return True


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _call(mod, x: torch.Tensor) -> torch.Tensor:
    return mod(x)


def forward(model, ids=None, embeds=None, cache=None, positions=None, mask=None, logits_to_keep: int = 0,
            head: bool = True):
    """Logits (B, T', V) in the model's dtype for ids (B, T) or embeds (B, T, hidden); `cache` (a DynamicCache or
    None) is extended as transformers would; `positions` (B, T) default to the cache length onwards; `mask` is
    what transformers' `attention_mask` takes (2-D padding or 4-D additive/boolean). With `head=False`, the
    final norm's output (B, T', hidden) instead of the logits."""
    from transformers.masking_utils import create_causal_mask
    inner = model.model
    x = inner.embed_tokens(ids) if embeds is None else embeds
    B, T = x.shape[0], x.shape[1]
    if positions is None:
        past = cache.get_seq_length() if cache is not None else 0
        positions = (torch.arange(T, device=x.device) + past).unsqueeze(0)
    if mask is None and T == 1:
        amask = None                        # a lone row sees every key: transformers would add zeros
    else:
        amask = create_causal_mask(config=model.config, inputs_embeds=x, attention_mask=mask,
                                   past_key_values=cache, position_ids=positions)
    cos, sin = inner.rotary_emb(x, positions)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    attend = attention.exact_attention
    plan = adapters.fused(model, x)
    lin = _call if plan is None else plan.linear
    for i, layer in enumerate(inner.layers):
        a, mlp = layer.self_attn, layer.mlp
        h = layer.input_layernorm(x)
        shape = (B, T, -1, a.head_dim)
        q = lin(a.q_proj, h).view(shape).transpose(1, 2)
        k = lin(a.k_proj, h).view(shape).transpose(1, 2)
        v = lin(a.v_proj, h).view(shape).transpose(1, 2)
        q = (q * cos) + (_rotate_half(q) * sin)
        k = (k * cos) + (_rotate_half(k) * sin)
        if cache is not None:
            k, v = cache.update(k, v, i)
        o, _ = attend(a, q, k, v, amask, scaling=a.scaling)
        x = x + lin(a.o_proj, o.reshape(B, T, -1).contiguous())
        h = layer.post_attention_layernorm(x)
        x = x + lin(mlp.down_proj, mlp.act_fn(lin(mlp.gate_proj, h)) * lin(mlp.up_proj, h))
    x = inner.norm(x)
    if logits_to_keep:
        x = x[:, -logits_to_keep:, :]
    return model.lm_head(x) if head else x
