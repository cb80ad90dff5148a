"""`python -m paradec`: generate, strategies, bench, serve and train."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _train(args) -> int:
    from .training import lm
    if args.what in ("default", "draft", "smoke"):
        name = args.name or {"default": "paradec-tiny", "draft": "paradec-tiny-draft",
                             "smoke": "paradec-smoke"}[args.what]
        defaults = {"default": dict(steps=1000), "draft": dict(steps=600, lr=3e-3),
                    "smoke": dict(steps=5, batch_size=2, seq_len=64, ckpt_every=2, eval_batches=1)}[args.what]
        cfg = lm.TrainConfig(name=name, arch=args.what, **defaults)
        if args.steps:
            cfg.steps = args.steps
        tok_from = None
        if args.what == "draft":
            tok_from = Path(args.tokenizer_from or lm.MODELS / "paradec-tiny")
        elif args.tokenizer_from:
            tok_from = Path(args.tokenizer_from)
        out = Path(args.out) if args.out else None
        work = Path(args.work) if args.work else None
        lm.train(cfg, out_dir=out, tokenizer_from=tok_from, work=work)
        return 0
    raise SystemExit(f"unknown training target {args.what!r}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m paradec", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="train the default model, its draft, or PTP/LUD/FocusLLM parameters")
    t.add_argument("what", choices=["default", "draft", "smoke"])
    t.add_argument("--steps", type=int)
    t.add_argument("--name")
    t.add_argument("--out", help="output model folder (default data/models/NAME)")
    t.add_argument("--work", help="checkpoint folder (default data/work/NAME)")
    t.add_argument("--tokenizer-from", help="reuse this model folder's tokenizer")
    t.set_defaults(func=_train)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
