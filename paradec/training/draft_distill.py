"""Distil a draft model for any target: `python -m paradec train draft --model M`.

The draft (paradec.draft) is a short stack of the target's own decoder layers (by default the first and the
last), MLPs pruned to the neurons most active on the target's answers, and a vocabulary trimmed to the tokens
the target actually emits (FR-Spec, ACL 2025); it shares the target's input embeddings and LM-head rows at
load time, so the folder holds only the layers (bfloat16, tens of MB).

1. Teacher data: the target answers the training prompt set (paradec.training.prompts: chat requests made
   from the standard library, disjoint from evals/suites), once sampled at T 0.7 / top-k 50 / top-p 0.95 and
   once greedily, in left-padded batches (paradec.training.teacher: cached in data/work/<model>-teacher/,
   shared with the PTP trainer).
2. Vocabulary: the `--vocab` most frequent tokens of those answers (plus the stop tokens); its coverage of the
   held-out answers is measured and reported.
3. Training: cross-entropy of the draft on the target's answer tokens (prompt tokens are context only) over
   the kept vocabulary, AdamW with warm-up and cosine decay, checkpointed every --ckpt-every steps
   (resumable); the draft's acceptance on held-out answers (greedy: draft argmax == target token, i.e. the
   per-token acceptance of greedy sps) measured every --eval-every steps and stored as "curve".
"""
from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from .. import draft as D
from . import checkpoint
from . import teacher as TCH

ROOT = Path(__file__).resolve().parents[2]


def choose_vocab(rows: list[dict], size: int, always: set[int], fill: list[list[int]] = ()) -> list[int]:
    """Stop tokens, then the target's answer tokens by frequency, then its prompts' tokens (answers copy them),
    then the most frequent tokens of `fill` (tokenised corpus text) until `size`. Sorted ids."""
    keep = set(always)
    for counts in (Counter(t for r in rows for t in r["completion"]), Counter(t for r in rows for t in r["prompt"]),
                   Counter(t for ids in fill for t in ids)):
        for t, _n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
            if len(keep) >= size:
                return sorted(keep)
            keep.add(t)
    return sorted(keep)


def corpus_fill(engine, chars: int) -> list[list[int]]:
    """Token ids of the first `chars` characters of the training corpus' raw text (standard-library source and
    docs of the training modules): the vocabulary's filler beyond what the teacher answers contain."""
    from .ptp_train import _corpus
    out, n = [], 0
    for text in _corpus().train_raw:
        if n >= chars:
            break
        out.append(engine.tokenizer(text[:chars - n], add_special_tokens=False)["input_ids"])
        n += len(text)
    return out


def coverage(rows: list[dict], kept: list[int]) -> float:
    s = set(kept)
    toks = [t for r in rows for t in r["completion"]]
    return sum(t in s for t in toks) / max(1, len(toks))


def batches(rows: list[dict], batch: int, max_len: int, rng: random.Random):
    """Endless right-padded batches: ids (B, L), labels (B, L) = the next token where it is an answer token."""
    while True:
        pick = [rng.choice(rows) for _ in range(batch)]
        seqs, starts = [], []
        for r in pick:
            seq = (list(r["prompt"]) + list(r["completion"]))[-max_len:]
            seqs.append(seq)
            starts.append(max(0, len(seq) - len(r["completion"])))
        L = max(len(s) for s in seqs)
        ids = torch.zeros(len(seqs), L, dtype=torch.long)
        labels = torch.full((len(seqs), L), -100, dtype=torch.long)
        for i, (s, a) in enumerate(zip(seqs, starts)):
            ids[i, :len(s)] = torch.tensor(s)
            t = torch.tensor(s)
            lab = torch.full((len(s),), -100, dtype=torch.long)
            lab[max(0, a - 1):len(s) - 1] = t[max(1, a):]
            labels[i, :len(s)] = lab
        yield ids, labels


def step_loss(draft: D.Draft, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the kept vocabulary at answer positions (labels outside it are ignored)."""
    h = draft.hidden(ids)                                     # (B, L, hidden)
    sel = labels >= 0
    tgt = draft.to_kept(labels[sel])
    keep = tgt >= 0
    logits = draft.kept_logits(h[sel][keep])
    return torch.nn.functional.cross_entropy(logits.float(), tgt[keep])


@torch.no_grad()
def acceptance(draft: D.Draft, rows: list[dict], max_len: int) -> dict:
    """Per-token agreement on held-out answers: draft argmax (over its kept vocabulary) == the target's token,
    for greedy answers (greedy sps accepts exactly these) and sampled ones; plus the expected tokens per
    target pass of greedy sps with k = 4 drafts if each token were accepted independently at that rate."""
    res, per_kind = {}, {}
    for g in (True, False):
        sel = [r for r in rows if bool(r["greedy"]) == g and r["completion"]]
        hit = tot = 0
        for r in sel:
            seq = (list(r["prompt"]) + list(r["completion"]))[-max_len:]
            a = len(seq) - len(r["completion"])
            h = draft.hidden(torch.tensor([seq]))[0]
            pred = draft.kept_ids[draft.kept_logits(h[max(0, a - 1):len(seq) - 1]).argmax(-1)]
            tgt = torch.tensor(seq[max(1, a):])
            n_hit = int((pred == tgt).sum())
            hit += n_hit
            tot += len(tgt)
            if g:
                k = per_kind.setdefault(r.get("kind", "?"), [0, 0])
                k[0] += n_hit
                k[1] += len(tgt)
        res["greedy" if g else "sampled"] = round(hit / max(1, tot), 4)
    a = res.get("greedy", 0.0)
    res["greedy_tokens_per_pass_k4"] = round(sum(a ** i for i in range(5)), 3)
    res["greedy_by_kind"] = {k: round(h / max(1, t), 3) for k, (h, t) in sorted(per_kind.items())}
    return res


def train(args) -> Path:
    from tqdm import tqdm

    from ..engine import Engine, cpu_name
    torch.manual_seed(args.seed)
    engine = Engine.load(args.model, dtype="float32")
    out = Path(args.out) if args.out else D.shipped_dir(engine.name)
    work = Path(args.work) if args.work else ROOT / "data" / "work" / f"{engine.name}-distill"
    work.mkdir(parents=True, exist_ok=True)
    ans = TCH.answers(engine, args.prompts, args.eval_prompts, args.seed, args.max_prompt, args.gen_tokens,
                      args.gen_batch, args.teacher_cache or args.work)
    rows, held, data_desc = ans.rows, ans.held, ans.description
    teacher_min = ans.minutes_for_card()
    if args.teacher_only:
        print(f"teacher data: {len(rows)} rows, {len(held)} held-out ({teacher_min} min)", file=sys.stderr)
        return work
    kept = choose_vocab(rows, args.vocab, set(engine.eos_ids), corpus_fill(engine, args.fill_chars))
    cov = {"train": round(coverage(rows, kept), 4), "heldout": round(coverage(held, kept), 4)}
    print(f"vocabulary {len(kept)}: coverage of answer tokens train {cov['train']}, held-out {cov['heldout']}",
          file=sys.stderr)
    layers = [int(x) for x in args.layers.split(",")]
    ckpt = work / "draft_checkpoint.pt"
    st = checkpoint.load(ckpt)
    struct = {"layers": layers, "intermediate": args.intermediate, "kept": kept}
    if st is not None and st.get("struct") == struct:
        draft = D.Draft.from_state(engine, st["config"], st["draft"], kept)
        print(f"resuming from step {st['step']}", file=sys.stderr)
    else:
        st = None
        calib = [torch.tensor([(list(r["prompt"]) + list(r["completion"]))[-args.max_len:]])
                 for r in rows[:args.calib_rows]]
        draft = D.Draft.from_target(engine, layers, args.intermediate, kept, calib)
    for prm in engine.model.parameters():
        prm.requires_grad_(False)
    params = draft.trainable()
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    step, curve, elapsed = 0, [], 0.0
    if st is not None:
        opt.load_state_dict(st["opt"])
        step, curve, elapsed = st["step"], st["curve"], st["elapsed"]
        torch.set_rng_state(st["torch_rng"])
    rng = random.Random(args.seed * 1000 + step)
    data = batches(rows, args.batch, args.max_len, rng)

    def lr_at(s):
        if s < args.warmup:
            return args.lr * (s + 1) / args.warmup
        frac = (s - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))

    def save(final=False):
        meta = {"base_model": engine.name, "trained_with": "python -m paradec train draft " + " ".join(args.argv),
                "steps": step, "train_minutes": round(elapsed / 60, 2), "teacher_minutes": teacher_min,
                "hardware": f"{cpu_name()}, {torch.get_num_threads()} thread(s), {engine.device} "
                            f"({str(engine.dtype).replace('torch.', '')})",
                "data": data_desc, "vocab_coverage": cov, "lr": args.lr, "batch": args.batch,
                "max_len": args.max_len, "curve": curve, "complete": final,
                "heldout_acceptance": curve[-1] if curve else None}
        draft.save(out, meta)
        checkpoint.save(ckpt, {"struct": struct, "config": draft.config_dict(), "draft": draft.state(),
                               "opt": opt.state_dict(), "step": step, "curve": curve, "elapsed": elapsed,
                               "torch_rng": torch.get_rng_state()})

    if not curve:
        curve.append({"step": 0, **acceptance(draft, held, args.max_len)})
        print(curve[-1], file=sys.stderr, flush=True)
    deadline = time.time() + args.max_minutes * 60 if args.max_minutes else None
    bar = tqdm(total=args.steps, initial=step, desc="draft", file=sys.stderr, mininterval=10)
    ema = None
    while step < args.steps:
        ts = time.time()
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        ids, labels = next(data)
        loss = step_loss(draft, ids, labels)
        checkpoint.optimizer_step(loss, params, opt)
        loss = loss.detach()
        step += 1
        elapsed += time.time() - ts
        ema = float(loss) if ema is None else 0.95 * ema + 0.05 * float(loss)
        bar.update(1)
        bar.set_postfix(loss=f"{ema:.3f}")
        stop = deadline is not None and time.time() > deadline
        if step % args.eval_every == 0 or step == args.steps or stop:
            te = time.time()
            curve.append({"step": step, "loss": round(ema, 4), **acceptance(draft, held, args.max_len)})
            elapsed += time.time() - te
            print(curve[-1], file=sys.stderr, flush=True)
        if step % args.ckpt_every == 0 or step == args.steps or stop:
            save()
        if stop:
            print(f"stopping at step {step}: --max-minutes {args.max_minutes} reached", file=sys.stderr)
            break
    bar.close()
    save(final=True)
    write_card(out)
    print(f"wrote {out}", file=sys.stderr)
    return out


def write_card(folder: Path) -> Path:
    """README.md for a draft folder, from its draft_config.json (this run's own figures)."""
    import json
    cfg = json.loads((Path(folder) / D.CONFIG).read_text())
    curve = cfg.get("curve") or []
    last = curve[-1] if curve else {}
    size = (Path(folder) / D.WEIGHTS).stat().st_size
    lines = [f"# Draft model for `{cfg['base_model']}`", "",
             "A distilled draft for `sps` and `hf-assisted` (paradec/draft.py): target layers "
             f"{cfg['source_layers']} copied, MLPs pruned to {cfg['intermediate_size']} neurons, a vocabulary of "
             f"{cfg['kept_tokens']} tokens (the target's most frequent answer tokens; coverage of answer tokens: "
             f"{cfg.get('vocab_coverage')}); input embeddings and LM-head rows are the target's, taken at load. "
             f"File: {size / 1e6:.1f} MB (bfloat16).", "",
             f"- Trained with: `{cfg.get('trained_with')}`", f"- Data: {cfg.get('data')}",
             f"- Steps: {cfg.get('steps')} x batch {cfg.get('batch')} (rows of at most {cfg.get('max_len')} tokens), "
             f"lr {cfg.get('lr')}", f"- Time: {TCH.time_text(cfg.get('train_minutes'), cfg.get('teacher_minutes'))}; "
             f"hardware: {cfg.get('hardware')}",
             f"- Held-out per-token acceptance (draft argmax == target token): greedy answers {last.get('greedy')}, "
             f"sampled answers {last.get('sampled')}; by kind (greedy): {last.get('greedy_by_kind')}", "",
             "| step | loss | greedy | sampled |", "|---|---|---|---|"]
    lines += [f"| {c.get('step')} | {c.get('loss', '')} | {c.get('greedy')} | {c.get('sampled')} |" for c in curve]
    lines += ["", "Decoding with it is lossless whatever its quality: the target verifies every drafted token over "
              "its full vocabulary; tokens outside the draft's vocabulary get probability 0 in q, which rejection "
              "sampling handles exactly."]
    path = Path(folder) / "README.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m paradec train draft",
                                description="Distil a small draft model (the target's own layers, pruned and "
                                            "with a trimmed vocabulary) for speculative decoding.")
    p.add_argument("--model", default=None, help="target model (default: the default model)")
    p.add_argument("--layers", default="0,-1", help="target layers the draft starts from (comma-separated; -1 = last)")
    p.add_argument("--intermediate", type=int, default=2432, help="MLP neurons kept per layer")
    p.add_argument("--vocab", type=int, default=16384, help="draft vocabulary size (most frequent answer tokens)")
    p.add_argument("--fill-chars", type=int, default=3_000_000,
                   help="corpus characters whose frequent tokens fill the vocabulary after the answers' and prompts'")
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--prompts", type=int, default=288, help="training prompts answered by the target")
    p.add_argument("--eval-prompts", type=int, default=36)
    p.add_argument("--max-prompt", type=int, default=320, help="prompt tokens kept (the tail)")
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--gen-batch", type=int, default=48)
    p.add_argument("--calib-rows", type=int, default=16, help="answers used to rank MLP neurons for pruning")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--ckpt-every", type=int, default=50)
    p.add_argument("--max-minutes", type=float, help="stop (and save) after this much wall time")
    p.add_argument("--teacher-only", action="store_true", help="only make (and cache) the teacher answers")
    p.add_argument("--out", help="draft folder (default data/drafts/<model>)")
    p.add_argument("--work", help="checkpoint folder (default data/work/<model>-distill); also the teacher cache "
                                  "when --teacher-cache is not given")
    p.add_argument("--teacher-cache", help="folder of the target's cached answers (default data/work/<model>-teacher)")
    p.add_argument("--threads", type=int)
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    train(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
