"""What a draft costs against its target, batch 1: one draft token-pass, one target token-pass, and target passes
over k+1 new tokens (what `sps` verifies each step), after a cached context. The ratio draft/target is the
draft's price per proposal; with per-token acceptance a, sps gains (1 - a^(k+1)) / (1 - a) tokens per step.

    python evals/draft_cost.py [--model M] [--context 200] [--k 2,4,6,8] [--repeats 7]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from paradec.engine import Engine, cpu_name  # noqa: E402
from paradec.strategies import Request  # noqa: E402
from paradec.strategies.speculative import draft_model  # noqa: E402


def best(fn, repeats: int) -> float:
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--k", default="2,4,6,8")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    e = Engine.load(args.model)
    d = draft_model(e, Request(prompt="x"))
    g = torch.Generator().manual_seed(0)
    ctx = torch.randint(0, 1000, (args.context,), generator=g).tolist()
    tc, dc = e.new_cache(), d.new_cache()
    e.forward(ctx, tc, logits_to_keep=1)
    d.forward(ctx, dc, logits_to_keep=1)

    def target(T):
        def f():
            e.forward(ctx[:T], tc, positions=list(range(args.context, args.context + T)), logits_to_keep=T)
            e.crop(tc, args.context)
        return f

    def draft():
        d.forward([5], dc, positions=[args.context], logits_to_keep=1)
        d.crop(dc, args.context)

    t1 = best(target(1), args.repeats)
    td = best(draft, args.repeats * 3)
    import datetime as dt
    print(f"`python evals/draft_cost.py` ({dt.datetime.utcnow():%Y-%m-%d %H:%M} UTC, {cpu_name()}, "
          f"{torch.get_num_threads()} threads; {e.name} in {str(e.dtype).replace('torch.', '')} and its draft "
          f"{d.name}, context {args.context}, best of {args.repeats}):")
    print()
    print("| pass | ms | × one target token |\n|---|---|---|")
    print(f"| target, 1 token | {1000 * t1:.1f} | 1.00 |")
    print(f"| draft, 1 token | {1000 * td:.1f} | {td / t1:.3f} |")
    for k in [int(x) for x in args.k.split(",")]:
        tk = best(target(k + 1), args.repeats)
        print(f"| target, {k + 1} tokens (k = {k}) | {1000 * tk:.1f} | {tk / t1:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
