"""Row-exact attention: a query row's result does not depend on which other rows share the pass.

Lossless strategies are checked token for token against `ar`, which runs one-token passes, while they verify
drafts in passes of many rows. torch's fused CPU attention (SDPA's flash kernel) blocks its work by the number
of query rows, so in bfloat16 the same row rounds differently in a 6-row pass than alone (up to 0.2 in the
logits of Qwen2.5-0.5B): at a near-tie a verifying pass picks another token than `ar` (the 38 "lossless
mismatches" of the 2026-12-02 benchmarks, every one within 0.25 logit).

`exact_attention` computes every row as plain products: scores q k^T in float32 (one batched product, the
query heads grouped onto their key/value head, so GQA needs no copied keys), the additive mask, then the softmax
and p v in float64 (on an AMD EPYC, MKL's float32 product summed a row over its 196 keys in another order
than over the same keys followed by a pass's masked ones, whose weights are 0: 21 of 22 rows differed); the
row's output is cast back to the model's dtype. A row that sees a prefix of the keys (causal
rows: `ar`'s, and every verifying row of sps, pld and PTP) gets the same numbers whether it is alone or one of
many, whatever masked keys follow it (tests/test_attention.py checks it against one-token passes). Rows of a tree
pass that skip keys (lookahead's candidate branches: the context, then masked window rows, then their own chain)
sum their softmax over the same keys with zeros interleaved, which moves each term to another vector lane: in
float32 that changed the sum's rounding (on the default model in bf16, 4 of 32 such rows differed from one-token
passes, by up to 0.25 in a logit; the benchmark's one remaining mismatch of 2026-12-04, lookahead on
conversation-04). In float64 the sum's order no longer shows after the cast back: 0 of 32 (AMD EPYC, 2026-12-04).
Float32 scores are also closer to exact attention than eager bf16 scores (rounded to bf16 before the softmax).

What differed outside attention: on one benchmark prompt (conversation-01, turn 1) `ar`'s cache built token by
token differed from one built in a 140-row pass from layer 0's MLP on. oneDNN's packed bf16 product of the down
projection (896 x 4864) runs another kernel from 33 rows on, whose rows differ from the same rows alone, and `pld`'s
first pass (the prompt and its first proposals, over 32 rows) cached the proposals it accepted with those numbers;
at an exact tie it then picked the other token. paradec/kernels.py now probes each weight shape for a plan that
makes its rows independent of the row count (`row_plan`: 32-row pieces on that Xeon; on an AMD EPYC without AMX,
where the one-row kernel is the odd one out, a lone row padded to two), so a verifying row sees `ar`'s numbers in
the linears too (tests/test_attention.py checks it on the default model: prompt plus 10 drafts in one pass against
one-token passes).

Its scores take memory and float32 work in proportion to rows x keys, so a pass of more than `EXACT_MAX_ROWS`
rows whose scores would exceed `EXACT_MAX_SCORES` entries per key/value head (the prefill of a prompt over 512
tokens) goes to SDPA, which never materialises them (nor, for a prefill with no padding, the mask: `exact_mask`)
and multiplies in bf16: a prefill of 256 / 1,000 / 2,000 tokens of Qwen2.5-0.5B took 253 / 2,044 / 6,942 ms through the products against 232 / 800 / 2,081 ms through SDPA
(Intel Xeon with AMX, 2 cores). Such a prefill is the same for every strategy when its shape is; a strategy
whose first pass appends drafts to a long prompt may then round the prompt's cache differently from `ar`.

In a float32 model on a CPU the scores are float64 as well (`scores_dtype`): on an AMD EPYC with AVX2 only
(2026-12-06) the float32 product q k^T summed a row in another order in a one-token pass (the group's g rows) than
in a pass of 2 or more tokens, for head sizes 32, 64 and 128 alike, and the random test model's drafted rows got
logits 7e-6 off `ar`'s; float64 scores make them equal.

On CUDA the scores are float64 too (`scores_dtype`): cuBLAS picks its kernel, and so its summation order, by the
shape, and float32 scores of one row then differed with the row count; with float64 and paradec/kernels.py's
`fixed_rows` (every linear and RMSNorm over 64-row pieces) a random 8B-shaped model on an H200 gave 0 of 32 rows
differing against 2 of 32 without (docs/bench/gpu-check.md).

`use(model)` switches a loaded transformers model to it (registered as attention implementation "paradec-exact",
with eager's additive masks).
"""
from __future__ import annotations

import torch

NAME = "paradec-exact"
EXACT_MAX_ROWS = 64
EXACT_MAX_SCORES = 1 << 18


def exact_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                    **kwargs):
    """(B, H, T, D) queries over (B, KVH, L, D) keys and values -> ((B, T, H, D) output, None)."""
    B, H, T, D = query.shape
    KVH, L = key.shape[1], key.shape[2]
    if (goes_to_sdpa(T, L) or (dropout and module.training)
            or kwargs.get("softcap") is not None or kwargs.get("sinks") is not None or H % KVH):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    g = H // KVH
    scale = scaling if scaling is not None else D ** -0.5
    # scores in float32 on a CPU for a bf16 model (a row's summation order may change with the row count, but not
    # by enough to survive the cast back to bf16); for a float32 model, and on CUDA (cuBLAS picks its kernel, and so
    # its order, by the shape), float64, whose rounding does not survive the cast back (products of bf16 or float32
    # values are exact in it)
    acc = scores_dtype(query.device, query.dtype)
    q = query.reshape(B, KVH, g * T, D).to(acc)
    s = torch.matmul(q, key.to(acc).transpose(2, 3)).mul_(scale).view(B, KVH, g, T, L)
    if attention_mask is not None:
        m = attention_mask[..., :L] if attention_mask.shape[-1] != L else attention_mask    # as eager slices it
        if m.dim() == 2:
            m = m[None, None]
        m = m.view(m.shape[0], KVH, g, T, L) if m.shape[1] == H else m[:, :, None]
        s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s.add_(m.to(acc))
    p = torch.softmax(s.double(), dim=-1).view(B, KVH, g * T, L)
    # p v sums over the keys in float64: float32 GEMMs (MKL on an AMD EPYC) sum a row over 196 keys in another order
    # than over the same keys followed by zero weights; float64 sums of float32 products round back the same
    o = torch.matmul(p, value.double()).view(B, H, T, D)
    return o.to(query.dtype).transpose(1, 2).contiguous(), None


def scores_dtype(device: torch.device, dtype: torch.dtype | None = None) -> torch.dtype:
    """What `exact_attention` computes q k^T in for queries of `dtype` on `device`: on CUDA (and elsewhere)
    float64; on a CPU float64 for a float32 model's inference passes, else (bf16 or fp16, or training) float32."""
    if device.type != "cpu":
        return torch.float64
    return torch.float64 if dtype == torch.float32 and not torch.is_grad_enabled() else torch.float32


def goes_to_sdpa(rows: int, keys: int) -> bool:
    """Whether `exact_attention` hands a pass of `rows` queries over `keys` keys to SDPA (too many scores)."""
    return rows > EXACT_MAX_ROWS and rows * keys > EXACT_MAX_SCORES


def exact_mask(batch_size: int, q_length: int, kv_length: int, *args, **kwargs):
    """The mask `exact_attention` gets: eager's additive mask for the passes it computes itself; for a pass it hands
    to SDPA, SDPA's own mask, which is None (SDPA's causal flag) for a prefill with no padding, so a long prompt
    never materialises its L x L mask (2 GB at 32K tokens in bf16) nor repeats keys for GQA."""
    from transformers.masking_utils import eager_mask, sdpa_mask
    if goes_to_sdpa(q_length, kv_length):
        kwargs.pop("dtype", None)
        return sdpa_mask(batch_size, q_length, kv_length, *args, **kwargs)
    return eager_mask(batch_size, q_length, kv_length, *args, **kwargs)


def register() -> str:
    """Register `exact_attention` (and `exact_mask` for it) with transformers; returns its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    AttentionInterface.register(NAME, exact_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, exact_mask)
    return NAME


def use(model) -> bool:
    """Run `model`'s attention through `exact_attention` from now on; False (and the model unchanged) when its
    attention does not go through transformers' attention interface (remote code, old architectures)."""
    register()
    try:
        model.set_attn_implementation(NAME)
    except (ValueError, AttributeError, NotImplementedError):
        return False
    return model.config._attn_implementation == NAME
