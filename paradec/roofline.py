"""The memory-read roofline of batch-1 decoding: how fast `ar` could be if reading was all a token cost.

At batch 1 a decode step reads every weight it uses once and does about two flops per weight, so on CPUs and
GPUs alike its time is bounded below by the bytes it must read divided by the memory-read bandwidth:

  W   weight bytes per token = sum over the model's parameters of numel × element size (their storage dtype:
      fp32 4, bf16/fp16 2), each tensor counted once (a tied LM head and input embedding are one tensor, read
      whole by the LM head), except that an input embedding table NOT tied to the LM head contributes one row
      (hidden × element size) per token: a look-up reads one row, not the table. Buffers (rotary tables) are
      not weights and are not counted.
  KV  KV-cache bytes read per token at context c = 2 (K and V) × layers × kv_heads × head_dim × c × element
      size. Decode step j after a prompt of P tokens attends to P + j positions (j = 1 … n−1), so over an
      output of n tokens the mean context is c̄ = P + n/2.
  B   memory-read bandwidth (bytes/s), measured here: the best of a few full reductions (sum) of an fp32
      buffer much larger than the last-level cache (max(1 GiB, 4 × W), capped by free memory), on the
      engine's device, with the threads torch uses for the model (the device synchronised around each run).

  roofline tokens/s   R = B / (W + KV(c̄))
  ar's fraction       ar decode tokens/s / R, with ar decode tokens/s = 1 / TPOT (prefill excluded);
                      the same with ar's E2E tokens/s (prefill included) is shown beside it.

Bandwidth is reported in GB/s (10^9 bytes/s). Activations, KV writes and the logits are not counted: they
are small at batch 1, so a fraction near 100% means decoding is read-bound and little is left to gain per
pass; parallel decoding wins by getting more than one token out of each full read of the weights.
"""
from __future__ import annotations

import math
import time

import torch

GIB = 1 << 30


def weight_bytes_per_token(model) -> int:
    """Bytes of weights one decode step reads (see the module docstring), at the model's storage dtype, or for a
    linear run by paradec's native kernel (`kernels.native_linears`) the bytes of the copy it reads (bfloat16 where
    that is exact: half a float32 model's)."""
    from .kernels import _NATIVE_TAG
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head_w = getattr(head, "weight", None)
    lookups = {id(m.weight) for m in model.modules()
               if isinstance(m, torch.nn.Embedding) and m.weight is not head_w}
    read = {}
    for m in model.modules():
        if getattr(m, _NATIVE_TAG, False) and m.weight.device.type == "cpu":
            packed = m.forward.packed()
            read[id(m.weight)] = packed.numel() * packed.element_size()
    total = 0
    for p in model.parameters():           # shared (tied) tensors come once
        if id(p) in read:
            total += read[id(p)]
        elif id(p) in lookups:
            total += p.shape[-1] * p.element_size()          # one row per token
        else:
            total += p.numel() * p.element_size()
    return int(total)


def _cfg(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def kv_bytes_per_context_token(config, dtype_bytes: int) -> int:
    """2 × layers × kv_heads × head_dim × dtype bytes: KV-cache bytes a decode step reads per position of context."""
    c = _cfg(config)
    heads = int(c.num_attention_heads)
    kv_heads = int(getattr(c, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(c, "head_dim", None) or c.hidden_size // heads)
    return 2 * int(c.num_hidden_layers) * kv_heads * head_dim * int(dtype_bytes)


def kv_bytes_per_token(config, context: float, dtype_bytes: int) -> float:
    """KV-cache bytes one decode step reads at `context` positions (use the mean context c̄ = P + n/2)."""
    return kv_bytes_per_context_token(config, dtype_bytes) * float(context)


def mean_context(prompt_tokens: int, new_tokens: int) -> float:
    """Mean attended context over the decode steps of an n-token output after a P-token prompt: P + n/2."""
    return prompt_tokens + new_tokens / 2


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def _free_bytes(device: torch.device) -> int | None:
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def probe_bytes(device, model_bytes: int = 0) -> int:
    """The default probe buffer: max(1 GiB, 4 × the model's bytes), capped at half the free memory."""
    device = torch.device(device)
    want = max(GIB, 4 * int(model_bytes))
    free = _free_bytes(device)
    if free is not None:
        want = min(want, free // 2)
    return max(want, 1 << 20)


def read_bandwidth(device="cpu", nbytes: int | None = None, runs: int = 5, threads: int | None = None,
                   min_time_s: float = 0.05) -> float:
    """Memory-read bandwidth of `device` in GB/s (10^9 bytes/s): the best of `runs` timed reductions of an
    fp32 buffer of `nbytes` (default `probe_bytes`). Each run sums the buffer as many times as needed to last
    about `min_time_s` (so a fast GPU is timed over more than one launch), the device synchronised before and
    after. `threads` sets torch's CPU threads for the probe (default: torch's current setting, the one the
    model runs with)."""
    device = torch.device(device)
    nbytes = int(nbytes or probe_bytes(device))
    n = max(nbytes // 4, 1)
    old = torch.get_num_threads()
    if threads:
        torch.set_num_threads(int(threads))
    try:
        buf = torch.ones(n, dtype=torch.float32, device=device)   # written once: every page is resident
        _sync(device)
        buf.sum()
        _sync(device)
        t = time.perf_counter()
        buf.sum()
        _sync(device)
        once = max(time.perf_counter() - t, 1e-9)
        reps = max(1, min(1000, math.ceil(min_time_s / once)))
        best = math.inf
        for _ in range(max(1, runs)):
            _sync(device)
            t = time.perf_counter()
            for _ in range(reps):
                buf.sum()
            _sync(device)
            best = min(best, (time.perf_counter() - t) / reps)
        del buf
    finally:
        if threads:
            torch.set_num_threads(old)
    return n * 4 / best / 1e9


def roofline(bandwidth_gbs: float, weight_bytes: float, kv_bytes: float = 0.0,
             decode_tokens_per_s: float | None = None, e2e_tokens_per_s: float | None = None) -> dict:
    """R = B / (W + KV) tokens/s, and the fractions of it that measured rates reach."""
    per_token = float(weight_bytes) + float(kv_bytes)
    roof = bandwidth_gbs * 1e9 / per_token if per_token > 0 and bandwidth_gbs else None

    def frac(v):
        return v / roof if v is not None and roof else None
    return {"bandwidth_gbs": bandwidth_gbs, "weight_bytes_per_token": float(weight_bytes),
            "kv_bytes_per_token": float(kv_bytes), "bytes_per_token": per_token, "roofline_tokens_per_s": roof,
            "decode_tokens_per_s": decode_tokens_per_s, "fraction": frac(decode_tokens_per_s),
            "e2e_tokens_per_s": e2e_tokens_per_s, "e2e_fraction": frac(e2e_tokens_per_s)}


def probe(engine, nbytes: int | None = None, runs: int = 5) -> dict:
    """What a bench run stores in its environment: the bandwidth and the model's read costs."""
    w = weight_bytes_per_token(engine.model)
    dtype_bytes = next(engine.model.parameters()).element_size()
    nbytes = int(nbytes or probe_bytes(engine.device, w))
    t = time.perf_counter()
    bw = read_bandwidth(engine.device, nbytes, runs=runs)
    return {"bandwidth_gbs": bw, "probe_bytes": nbytes, "probe_runs": runs, "threads": torch.get_num_threads(),
            "probe_s": time.perf_counter() - t, "weight_bytes_per_token": w,
            "kv_bytes_per_context_token": kv_bytes_per_context_token(engine.model.config, dtype_bytes),
            "parameter_bytes": sum(p.numel() * p.element_size() for p in engine.model.parameters())}


def line(r: dict) -> str:
    """One line: 'ar at 71% of the 8.4 tok/s read-bandwidth roofline (16.9 GB/s, 2.01 GB/token) …'."""
    def size(b):
        return f"{b / 1e9:.2f} GB" if b >= 1e8 else f"{b / 1e6:.1f} MB"
    roof, bw = r.get("roofline_tokens_per_s"), r.get("bandwidth_gbs")
    if not roof:
        return "roofline: not measured"
    kv = r.get("kv_bytes_per_token") or 0.0
    parts = f"{bw:.1f} GB/s, {size(r['bytes_per_token'])}/token"
    if kv:
        parts += f" = {size(r['weight_bytes_per_token'])} weights + {size(kv)} KV at mean context " \
                 f"{r.get('mean_context') or 0:.0f}"
    elif r.get("kv_included") is False:
        parts += " of weights, KV-cache reads excluded"
    if r.get("fraction") is None:
        return f"read-bandwidth roofline {roof:.1f} tok/s ({parts}); no ar decode rate to compare"
    s = (f"ar at {100 * r['fraction']:.0f}% of the {roof:.1f} tok/s read-bandwidth roofline ({parts}): "
         f"decode {r['decode_tokens_per_s']:.1f} tok/s (1/TPOT p50)")
    if r.get("e2e_fraction") is not None:
        s += f", E2E {r['e2e_tokens_per_s']:.1f} tok/s ({100 * r['e2e_fraction']:.0f}%, prefill included)"
    return s


def main(args) -> int:
    """`python -m paradec roofline [--model M] [--context C]`: the probe and the roofline, without a benchmark."""
    from .cli import load_engine
    engine = load_engine(args)
    if getattr(engine, "remote", False):
        raise SystemExit("error: the roofline is measured on the engine's own device; run it on the server's host")
    rf = probe(engine)
    kv = rf["kv_bytes_per_context_token"] * args.context
    r = roofline(rf["bandwidth_gbs"], rf["weight_bytes_per_token"], kv)
    print(f"{engine.name} on {engine.device} ({engine.dtype}, {rf['threads']} threads): read bandwidth "
          f"{rf['bandwidth_gbs']:.1f} GB/s ({rf['probe_bytes'] / 2**30:.2f} GiB buffer, best of {rf['probe_runs']}); "
          f"weights read per token {rf['weight_bytes_per_token'] / 1e6:.1f} MB (all parameters "
          f"{rf['parameter_bytes'] / 1e6:.1f} MB), KV at context {args.context} {kv / 1e6:.2f} MB; "
          f"roofline {r['roofline_tokens_per_s']:.1f} tok/s")
    return 0
