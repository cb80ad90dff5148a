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
    costs = curve(e, cache, args.context, [int(x) for x in args.tokens.split(",")], args.repeats, g)
    print_table(f"--dtype {args.dtype}", e, args, [("", costs)])
    return 0


def print_table(flags: str, e, args, rows: list[tuple[str, dict[int, float]]]) -> None:
    """The Markdown block BENCHMARKS.md shows: a header naming the command, machine and model, then per labelled
    curve its milliseconds and its cost in one-token passes."""
    import datetime as dt
    where = cpu_name() if e.device.type == "cpu" else str(e.device)
    print(f"`python evals/forward_cost.py {flags}` ({dt.datetime.utcnow():%Y-%m-%d %H:%M} UTC, {where}, "
          f"{torch.get_num_threads()} threads; {e.name} in {str(e.dtype).replace('torch.', '')} on {e.device}, "
          f"context {args.context}, best of {args.repeats}):")
    print()
    tokens = list(rows[0][1])
    print("| new tokens in the pass | " + " | ".join(str(T) for T in tokens) + " |")
    print("|---|" + "---|" * len(tokens))
    for label, c in rows:
        lead = f"{label}, " if label else ""
        print(f"| {lead}ms | " + " | ".join(f"{1000 * c[T]:.1f}" for T in tokens) + " |")
        print(f"| {lead}× one token | " + " | ".join(f"{c[T] / c[tokens[0]]:.2f}" for T in tokens) + " |")


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
    """float32: paradec's streamed W @ xᵀ against torch's F.linear, in one process."""
    from paradec import kernels
    tokens = [int(x) for x in args.tokens.split(",")]
    kernels.stream_linears(e.model)
    fast = curve(e, cache, args.context, tokens, args.repeats, g)
    kernels.unstream_linears(e.model)
    plain = curve(e, cache, args.context, tokens, args.repeats, g)
    kernels.stream_linears(e.model)
    print_table("--compare", e, args, [("F.linear", plain), ("paradec (W @ xᵀ)", fast)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
