"""Chunk selection for `pcw` / `ape` (`select` k): how often the chunk that holds the answer is among the k best by
`chunk_order`, measured on retrieval items that are NOT the long-context suite's, so that k is chosen without
looking at the suite.

Items: the FocusLLM trainer's retrieval memories (paradec/training/needles.py: a code hidden in text, several codes
with owners, a key/value listing; their wording, names and filler are not the suite's) built on the HELD-OUT part of
the training corpus (standard-library source and documentation), written out as one chat prompt each: the memory,
a blank line, the question. Per item and per chunk layout (pcw's: a BOS only; ape's: the prompt's opening shared by
every chunk) the chunks are encoded in one batch exactly as the strategy does, scored once, and the rank of the
chunk whose text holds the answer is recorded. Recall@k = share of items whose answer chunk is among the k best.
`--answers k1,k2` also runs `pcw+select=k` and `ape+select=k` (and plain `pcw` / `ape`) end to end on the same
items and counts correct answers (the value appears in the answer).

    python evals/chunk_select_dev.py [--lengths 2048,4096,8192] [--per-length 8] [--window 512]
                                     [--answers 1,2] [--out docs/bench/chunk-select-dev.md]
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from evals.longcontext_eval import machine, run_strategy  # noqa: E402
from paradec.engine import Engine  # noqa: E402
from paradec.strategies import Request, get  # noqa: E402
from paradec.strategies.parallel_context import RULES, chunk_order, encode_batch, probe_pass, probe_tokens  # noqa: E402
from paradec.training.needles import needle_memory  # noqa: E402

KINDS = ("code", "owned", "listing")
STREAMS = ROOT / "data" / "work" / "focus-needle-ckpt" / "focus_data.pt"


def held_out_stream(engine) -> list[int]:
    """The training corpus' held-out token stream (the FocusLLM trainer's cached copy when there is one), its
    document separators removed."""
    if STREAMS.exists():
        streams = torch.load(STREAMS, weights_only=False)
    else:
        from paradec.training.focus_train import token_streams
        streams = token_streams(engine)
    eos = set(engine.eos_ids)
    return [t for t in streams["val"] if t not in eos]


def dev_items(engine, lengths: list[int], per_length: int, seed: int = 7) -> list[dict]:
    """Retrieval prompts of about `lengths` tokens, `per_length` each, kinds in turn."""
    tok, stream = engine.tokenizer, held_out_stream(engine)
    rng = random.Random(seed)
    items = []
    for L in lengths:
        for i in range(per_length):
            kind = KINDS[i % len(KINDS)]
            _, chunks, qa = needle_memory(tok, stream, L // 512, 512, 1, rng, kind)
            question, answer, _ = qa[0]
            memory = engine.decode([t for c in chunks for t in c]).strip()
            items.append({"id": f"dev-{L}-{i}", "kind": kind, "approx": L, "answer": answer,
                          "prompt": memory + "\n\n" + question})
    return items


def ranks(engine, item: dict, spec: str, window: int) -> dict:
    """Encode the item's chunks as `spec` (pcw or ape) would, score them, and return the answer chunk's rank."""
    strat = get(spec)
    req = Request(prompt=item["prompt"], max_new_tokens=16, max_context=window)
    lay = strat.layout(engine, req)
    chunks = lay["chunks"]
    holds = [i for i, c in enumerate(chunks) if item["answer"] in engine.decode(c)]
    t0 = time.perf_counter()
    bcache, mask, nxt = encode_batch(engine, chunks, lay["shared"])
    t1 = time.perf_counter()
    question = lay["question"]
    lp, answer = probe_pass(engine, bcache, mask, nxt, question, len(probe_tokens(engine, question)))
    t2 = time.perf_counter()
    rank = {}
    for rule in RULES:
        order = chunk_order(lp, answer, rule)
        rank[rule] = min((order.index(i) + 1 for i in holds), default=None)
    return {"chunks": len(chunks), "holds": holds, "rank": rank, "encode_s": t1 - t0, "score_s": t2 - t1}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="2048,4096,8192")
    ap.add_argument("--per-length", type=int, default=8)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--answers", default="", help="also answer end to end with select = these k (comma list)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default=str(ROOT / "docs" / "bench" / "chunk-select-dev.md"))
    args = ap.parse_args(argv)
    engine = Engine.load(None, dtype="auto")
    lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    items = dev_items(engine, lengths, args.per_length, args.seed)
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"{len(items)} dev items; {machine()}", flush=True)
    rows = []
    for it in items:
        for spec in ("pcw", "ape"):
            r = ranks(engine, it, spec, args.window)
            rows += [{**r, "rank": r["rank"][rule], "id": it["id"], "kind": it["kind"], "approx": it["approx"],
                      "spec": spec, "rule": rule} for rule in RULES]
            print(f"  {it['id']:12s} {it['kind']:8s} {spec}: {r['chunks']} chunks, answer in {r['holds']}, rank "
                  f"{r['rank']}  encode {r['encode_s']:.1f}s score {r['score_s']:.2f}s", flush=True)
    answers = []
    ks = [int(x) for x in args.answers.split(",") if x.strip()]
    if ks:
        specs = ["pcw", "ape"] + [f"{s}+select={k}" for k in ks for s in ("pcw", "ape")]
        for it in items:
            req = Request(prompt=it["prompt"], max_new_tokens=16)
            for s in specs:
                lane = run_strategy(engine, s, req, args.window)
                ok = not lane.error and it["answer"] in (lane.text or "")
                answers.append({"id": it["id"], "approx": it["approx"], "kind": it["kind"], "spec": s, "ok": ok,
                                "text": lane.text, "error": lane.error})
                print(f"  {it['id']:12s} {s:16s} {'OK' if ok else '--'} {(lane.text or lane.error or '')[:30]!r}",
                      flush=True)
    page = render(rows, answers, lengths, args, when)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(page)
    print(page)
    return 0


def render(rows, answers, lengths, args, when) -> str:
    out = ["# Chunk selection on held-out retrieval items (not the long-context suite)", "",
           f"`python evals/chunk_select_dev.py --lengths {args.lengths} --per-length {args.per_length} "
           f"--window {args.window}" + (f" --answers {args.answers}" if args.answers else "") + "`", "",
           f"- Date: {when}", f"- Machine: {machine()}", "",
           "Recall@k: share of items whose answer chunk ranks among the first k of `chunk_order` under each rule "
           "(question: the mean log-probability of the question's tokens after the chunk; answer: the model's "
           "certainty of its answer's first token after the chunk; both: the two interleaved). Items whose answer "
           "was cut across two chunks count as misses.",
           "", "| layout | rule | length | items | chunks | recall@1 | recall@2 | recall@3 | scoring s (median) | "
           "chunk encoding s (median) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for spec, rule in [(s, u) for s in ("pcw", "ape") for u in RULES]:
        for L in lengths + [0]:
            rs = [r for r in rows if r["spec"] == spec and r["rule"] == rule and (not L or r["approx"] == L)]
            if not rs:
                continue
            rec = [sum(1 for r in rs if r["rank"] and r["rank"] <= k) / len(rs) for k in (1, 2, 3)]
            med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
            out.append(f"| {spec} | {rule} | {L or 'all'} | {len(rs)} | {med([r['chunks'] for r in rs])} | "
                       + " | ".join(f"{x:.2f}" for x in rec)
                       + f" | {med([r['score_s'] for r in rs]):.2f} | {med([r['encode_s'] for r in rs]):.2f} |")
    if answers:
        specs = list(dict.fromkeys(a["spec"] for a in answers))
        out += ["", "Answers end to end (the value appears in the answer):", "",
                "| length | " + " | ".join(specs) + " |", "|---|" + "---|" * len(specs)]
        for L in lengths + [0]:
            rs = [a for a in answers if not L or a["approx"] == L]
            out.append(f"| {L or 'all'} | " + " | ".join(
                f"{sum(a['ok'] for a in rs if a['spec'] == s)}/{sum(1 for a in rs if a['spec'] == s)}" for s in specs)
                + " |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
