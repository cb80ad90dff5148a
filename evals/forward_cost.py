"""Cost of one forward pass over T new tokens after a cached context, batch 1: the number that decides whether
verifying drafted tokens is nearly free (memory-bound) or costs T times a token (compute-bound).

    python evals/forward_cost.py [--model M] [--dtype auto] [--context 200] [--tokens 1,4,11,16,32,64]
    python evals/forward_cost.py --ceiling [--rounds 3]
    python evals/forward_cost.py --lud [--tokens 1,2,5,9,13] [--rounds 3]

--lud also times each pass with the model's LUD parameters applied as `lud` / `lud-verified` apply them: the
gated LoRA hooks, pad embedding and STOP column on all rows but the first (the pad slots), in one process,
plain and gated alternating per pass size: what those hooks cost a pass. In bf16 on a CPU the gated deltas go
through paradec's native kernel (`native.lora_add`), added by the lean pass itself (`adapters.fused`); the table
then also has them through the linears' hooks (the same kernel) and through the oneDNN pair.

--ceiling asks how close to the read-bandwidth roofline (paradec/roofline.py) a one-token pass can get on this
machine with the kernels the engine uses: in one process, interleaved rounds of (a) the bandwidth probe `bench`
uses, (b) a whole one-token pass with a cached context, (c) the model's linear layers alone, each called once in
the model's order on one row (their packed / stacked forwards, as in a pass; siblings share one input as they
do in a pass). (c) is a floor for a pass (every weight byte a token reads goes through a linear, the input
embedding's one row aside), so bytes ÷ (c) is the best fraction of the roofline these kernels allow.
"""
from __future__ import annotations

import argparse
import sys
import time
from contextlib import nullcontext
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
    ap.add_argument("--ceiling", action="store_true",
                    help="the roofline fraction a one-token pass reaches against its linear layers alone (see above)")
    ap.add_argument("--rounds", type=int, default=3, help="--ceiling: interleaved rounds; --lud: repeats x rounds passes")
    ap.add_argument("--lud", action="store_true", help="also with the LUD gate open on all rows but the first")
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
    if args.ceiling:
        return ceiling(args, e, cache, g)
    if args.lud:
        return lud_cost(args, e, cache, g)
    costs = curve(e, cache, args.context, [int(x) for x in args.tokens.split(",")], args.repeats, g)
    print_table(f"--dtype {args.dtype}", e, args, [("", costs)])
    return 0


def print_table(flags: str, e, args, rows: list[tuple[str, dict[int, float]]], how: str = "") -> None:
    """The Markdown block BENCHMARKS.md shows: a header naming the command, machine and model, then per labelled
    curve its milliseconds and its cost in one-token passes."""
    import datetime as dt
    where = cpu_name() if e.device.type == "cpu" else str(e.device)
    print(f"`python evals/forward_cost.py {flags}` ({dt.datetime.utcnow():%Y-%m-%d %H:%M} UTC, {where}, "
          f"{torch.get_num_threads()} threads; {e.name} in {str(e.dtype).replace('torch.', '')} on {e.device}, "
          f"context {args.context}, {how or f'best of {args.repeats}'}):")
    print()
    tokens = list(rows[0][1])
    print("| new tokens in the pass | " + " | ".join(str(T) for T in tokens) + " |")
    print("|---|" + "---|" * len(tokens))
    for label, c in rows:
        lead = f"{label}, " if label else ""
        print(f"| {lead}ms | " + " | ".join(f"{1000 * c[T]:.1f}" for T in tokens) + " |")
        print(f"| {lead}× one token | " + " | ".join(f"{c[T] / c[tokens[0]]:.2f}" for T in tokens) + " |")


def curve(e, cache, context: int, tokens: list[int], repeats: int, g, gate=None) -> dict[int, float]:
    """Best-of-`repeats` seconds of a pass over T new tokens after `context` cached ones, for each T; with
    `gate` (an adapter), its gate open on the pass's last T-1 rows."""
    out = {}
    for T in tokens:
        new = torch.randint(0, 1000, (T,), generator=g).tolist()
        times = []
        for _ in range(repeats):
            e.sync()
            t0 = time.perf_counter()
            with gate.gated(torch.arange(T) > 0) if gate is not None else nullcontext():
                e.forward(new, cache, positions=list(range(context, context + T)), logits_to_keep=T)
            e.sync()
            times.append(time.perf_counter() - t0)
            e.crop(cache, context)
        out[T] = min(times)
    return out


def lud_cost(args, e, cache, g) -> int:
    """Plain passes against passes with the LUD gate open on the pad rows, pass by pass in turn (repeats x rounds
    passes of each way and size; the median and the best); where the deltas go through paradec's native kernel (bf16 on a CPU,
    `native.lora_add`), added by the lean pass, also through the hooks and through the oneDNN pair."""
    from paradec import adapters, native
    from paradec.lud import LUDAdapter
    ad = LUDAdapter.require(e, None)
    tokens = [int(x) for x in args.tokens.split(",")]
    both = e.device.type == "cpu" and e.dtype == torch.bfloat16 and adapters._NATIVE and native.available()
    ways = [("LUD gate on T-1 rows" + (", native kernel, lean pass adds" if both else ""), adapters._NATIVE, True)]
    if both:
        ways += [("LUD gate on T-1 rows, native kernel, hooks", True, False),
                 ("LUD gate on T-1 rows, oneDNN pair", False, False)]
    names = ["plain"] + [w for w, _, _ in ways]
    times: dict[str, dict[int, list[float]]] = {w: {T: [] for T in tokens} for w in names}
    keep = adapters._NATIVE, adapters._FUSE
    try:
        with torch.inference_mode(), ad.attached(e.model):
            for T in tokens:                # pass by pass in turn: a shared machine's drifts hit every way alike
                for _ in range(args.repeats * args.rounds):
                    times["plain"][T].append(curve(e, cache, args.context, [T], 1, g)[T])
                    for w, on, fuse in ways:
                        adapters._NATIVE, adapters._FUSE = on, fuse
                        times[w][T].append(curve(e, cache, args.context, [T], 1, g, gate=ad)[T])
    finally:
        adapters._NATIVE, adapters._FUSE = keep
    q = lambda xs, f: sorted(xs)[int(f * (len(xs) - 1))]          # noqa: E731
    print_table(f"--dtype {args.dtype} --lud --tokens {args.tokens} --repeats {args.repeats} --rounds {args.rounds}",
                e, args, [(f"{w}, median", {T: q(times[w][T], 0.5) for T in tokens}) for w in names]
                + [(f"{w}, best", {T: min(times[w][T]) for T in tokens}) for w in names],
                how=f"{args.repeats * args.rounds} passes of each way and size, one of each in turn")
    return 0


def compare(args, e, cache, g) -> int:
    """float32: torch's F.linear, paradec's streamed W @ xᵀ (row plans) and, where it runs, paradec's native kernel
    (paradec/native.py), in one process."""
    from paradec import kernels, native
    tokens = [int(x) for x in args.tokens.split(",")]
    kernels.unnative_linears(e.model)
    kernels.unstream_linears(e.model)
    rows = [("F.linear", curve(e, cache, args.context, tokens, args.repeats, g))]
    kernels.stream_linears(e.model)
    rows.append(("paradec streamed (W @ xᵀ)", curve(e, cache, args.context, tokens, args.repeats, g)))
    kernels.unstream_linears(e.model)
    if native.available():
        kernels.native_linears(e.model)
        rows.append(("paradec native", curve(e, cache, args.context, tokens, args.repeats, g)))
    else:
        print(f"native kernel not available: {native.why()}")
    kernels.unnative_linears(e.model)
    kernels.apply(e.model, e.device, e.dtype)
    print_table("--compare", e, args, rows)
    return 0


def linears_alone(e, repeats: int) -> float:
    """Best-of-`repeats` seconds of every nn.Linear of the model (the LM head included) called once on one row, in
    the model's order; siblings of one parent (kernels.SIBLINGS) get one shared input tensor, as in a pass."""
    from paradec.kernels import SIBLINGS
    mods = [(n, m) for n, m in e.model.named_modules() if isinstance(m, torch.nn.Linear)]
    sib = {s for group in SIBLINGS for s in group}
    inputs, shared = [], {}
    for n, m in mods:
        parent, last = n.rsplit(".", 1) if "." in n else ("", n)
        k = (parent, next((g for g in SIBLINGS if last in g), None)) if last in sib else None
        if k is not None and k in shared:
            x = shared[k]
        else:
            x = torch.randn(1, 1, m.in_features, dtype=m.weight.dtype, device=m.weight.device)
            if k is not None:
                shared[k] = x
        inputs.append((m, x))
    best = float("inf")
    with torch.inference_mode():
        for _ in range(repeats):
            e.sync()
            t0 = time.perf_counter()
            for m, x in inputs:
                m(x)
            e.sync()
            best = min(best, time.perf_counter() - t0)
    return best


def ceiling(args, e, cache, g) -> int:
    """Interleaved rounds of the bandwidth probe, a one-token pass and the linears alone; a Markdown table."""
    import datetime as dt
    from paradec import roofline
    w = roofline.weight_bytes_per_token(e.model)
    kv = roofline.kv_bytes_per_token(e.model.config, args.context, next(e.model.parameters()).element_size())
    per_token = w + kv
    where = cpu_name() if e.device.type == "cpu" else str(e.device)
    print(f"`python evals/forward_cost.py --ceiling` ({dt.datetime.utcnow():%Y-%m-%d %H:%M} UTC, {where}, "
          f"{torch.get_num_threads()} threads; {e.name} in {str(e.dtype).replace('torch.', '')} on {e.device}, "
          f"context {args.context}; a token reads {w / 1e6:.0f} MB of weights + {kv / 1e6:.1f} MB of KV; "
          f"best of {args.repeats} per round):")
    print()
    print("| round | probe GB/s | roofline ms/token | one-token pass ms | pass ÷ roofline | linears alone ms "
          "| linears' GB/s | linears ÷ roofline (best a pass could reach) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in range(args.rounds):
        bw = roofline.read_bandwidth(e.device)
        roof = per_token / (bw * 1e9)
        one = curve(e, cache, args.context, [1], args.repeats, g)[1]
        lin = linears_alone(e, args.repeats)
        print(f"| {r + 1} | {bw:.1f} | {roof * 1e3:.1f} | {one * 1e3:.1f} | {roof / one:.0%} | {lin * 1e3:.1f} "
              f"| {w / lin / 1e9:.1f} | {roof / lin:.0%} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
