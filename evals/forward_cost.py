"""Cost of one forward pass over T new tokens after a cached context, batch 1: the number that decides whether
verifying drafted tokens is nearly free (memory-bound) or costs T times a token (compute-bound).

    python evals/forward_cost.py [--model M] [--dtype auto] [--context 200] [--tokens 1,4,11,16,32,64]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from paradec.engine import Engine, cpu_name  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--tokens", default="1,2,4,5,8,11,16,32,64")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--compare", action="store_true",
                    help="also measure with torch's F.linear (paradec.kernels switched off) and print a Markdown table")
    args = ap.parse_args(argv)
    e = Engine.load(args.model, dtype=args.dtype)
    g = torch.Generator().manual_seed(0)
    ctx = torch.randint(0, 1000, (args.context,), generator=g).tolist()
    cache = e.new_cache()
    e.forward(ctx, cache, logits_to_keep=1)
    if args.compare:
        return compare(args, e, cache, g)
    import datetime as dt
    costs = curve(e, cache, args.context, [int(x) for x in args.tokens.split(",")], args.repeats, g)
    base = next(iter(costs.values()))
    print(f"`python evals/forward_cost.py --dtype {args.dtype}` ({dt.datetime.utcnow():%Y-%m-%d %H:%M} UTC, "
          f"{cpu_name() if e.device.type == 'cpu' else e.device}, {torch.get_num_threads()} threads; {e.name} in "
          f"{str(e.dtype).replace('torch.', '')} on {e.device}, context {args.context}, best of {args.repeats}):")
    print()
    print("| new tokens in the pass | " + " | ".join(str(T) for T in costs) + " |")
    print("|---|" + "---|" * len(costs))
    print("| ms | " + " | ".join(f"{1000 * c:.1f}" for c in costs.values()) + " |")
    print("| × one token | " + " | ".join(f"{c / base:.2f}" for c in costs.values()) + " |")
    return 0


def curve(e, cache, context: int, tokens: list[int], repeats: int, g) -> dict[int, float]:
    """Best-of-`repeats` seconds of a pass over T new tokens after `context` cached ones, for each T."""
    out = {}
    for T in tokens:
        new = torch.randint(0, 1000, (T,), generator=g).tolist()
        times = []
        for _ in range(repeats):
            e.sync()
            t0 = time.perf_counter()
            e.forward(new, cache, positions=list(range(context, context + T)), logits_to_keep=T)
            e.sync()
            times.append(time.perf_counter() - t0)
            e.crop(cache, context)
        out[T] = min(times)
    return out


def compare(args, e, cache, g) -> int:
    import datetime as dt

    from paradec import kernels
    tokens = [int(x) for x in args.tokens.split(",")]
    kernels.stream_linears(e.model)
    fast = curve(e, cache, args.context, tokens, args.repeats, g)
    kernels.unstream_linears(e.model)
    plain = curve(e, cache, args.context, tokens, args.repeats, g)
    kernels.stream_linears(e.model)
    print(f"`python evals/forward_cost.py --compare` ({dt.datetime.utcnow():%Y-%m-%d %H:%M} UTC, {cpu_name()}, "
          f"{torch.get_num_threads()} threads; {e.name} in {str(e.dtype).replace('torch.', '')}, context "
          f"{args.context}, best of {args.repeats}):")
    print()
    print("| new tokens in the pass | " + " | ".join(str(T) for T in tokens) + " |")
    print("|---|" + "---|" * len(tokens))
    print("| F.linear, ms | " + " | ".join(f"{1000 * plain[T]:.1f}" for T in tokens) + " |")
    print("| F.linear, × one token | " + " | ".join(f"{plain[T] / plain[1]:.2f}" for T in tokens) + " |")
    print("| paradec (W @ xᵀ), ms | " + " | ".join(f"{1000 * fast[T]:.1f}" for T in tokens) + " |")
    print("| paradec, × one token | " + " | ".join(f"{fast[T] / fast[1]:.2f}" for T in tokens) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
