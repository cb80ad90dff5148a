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
from paradec.engine import Engine  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--tokens", default="1,4,11,16,32,64")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    e = Engine.load(args.model, dtype=args.dtype)
    g = torch.Generator().manual_seed(0)
    ctx = torch.randint(0, 1000, (args.context,), generator=g).tolist()
    cache = e.new_cache()
    e.forward(ctx, cache, logits_to_keep=1)
    print(f"{e.name} {str(e.dtype).replace('torch.', '')} on {e.device}, {torch.get_num_threads()} threads, "
          f"context {args.context}")
    base = None
    for T in [int(x) for x in args.tokens.split(",")]:
        new = torch.randint(0, 1000, (T,), generator=g).tolist()
        times = []
        for _ in range(args.repeats):
            e.sync()
            t0 = time.perf_counter()
            e.forward(new, cache, positions=list(range(args.context, args.context + T)), logits_to_keep=T)
            e.sync()
            times.append(time.perf_counter() - t0)
            e.crop(cache, args.context)
        best = min(times)
        base = base or best
        print(f"  T={T:3d}: {1000 * best:7.1f} ms  ({best / base:.2f}x one token)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
