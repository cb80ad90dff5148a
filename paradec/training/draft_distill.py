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
   With `--soft-top K` the targets are soft instead: the target (in `--teacher-dtype`, bfloat16 by default)
   reads each answer once, teacher-forced, and its K most probable next tokens with their probabilities label
   every answer position; `--corpus-windows N` adds N windows of the training corpus (standard-library text and
   its docstring conversations, training modules only) labelled the same way, `--corpus-share` of each batch.
   The loss is the cross-entropy against that top-K restricted to the kept vocabulary and renormalised there.
   One teacher-forced pass labels a few hundred positions where generation gives one token per pass, so the
   draft sees far more of the target's behaviour for the same CPU time.
"""
from __future__ import annotations

import argparse
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


def answer_span(r: dict, max_len: int) -> tuple[list[int], int]:
    """An answer row as (ids, first): the last max_len tokens of prompt + answer, and the first position whose
    next token is an answer token."""
    seq = (list(r["prompt"]) + list(r["completion"]))[-max_len:]
    return seq, max(0, len(seq) - len(r["completion"]) - 1)


def batches(rows: list[dict], batch: int, max_len: int, rng: random.Random):
    """Endless right-padded batches: ids (B, L), labels (B, L) = the next token where it is an answer token."""
    while True:
        spans = [answer_span(rng.choice(rows), max_len) for _ in range(batch)]
        L = max(len(s) for s, _f in spans)
        ids = torch.zeros(len(spans), L, dtype=torch.long)
        labels = torch.full((len(spans), L), -100, dtype=torch.long)
        for i, (s, first) in enumerate(spans):
            t = torch.tensor(s)
            ids[i, :len(s)] = t
            labels[i, first:len(s) - 1] = t[first + 1:]
        yield ids, labels


def step_loss(draft: D.Draft, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the kept vocabulary at answer positions (labels outside it are ignored)."""
    h = draft.hidden(ids)                                     # (B, L, hidden)
    sel = labels >= 0
    tgt = draft.to_kept(labels[sel])
    keep = tgt >= 0
    logits = draft.kept_logits(h[sel][keep])
    return torch.nn.functional.cross_entropy(logits.float(), tgt[keep])


def corpus_windows(engine, n: int, max_len: int, seed: int) -> list[list[int]]:
    """`n` token windows (at most max_len tokens) of the training corpus: raw standard-library text and its
    chat-formatted docstring / outline conversations, training modules only (paradec.training.corpus; the
    suites are never read), at most two windows per text, in a seeded random order."""
    from .ptp_train import _corpus
    c = _corpus()
    texts = list(c.train_raw)
    tok = engine.tokenizer
    if engine.has_chat_template:
        texts += [tok.apply_chat_template(m, tokenize=False) for m in c.train_chat]
    random.Random(seed).shuffle(texts)
    out = []
    for text in texts:
        if len(out) >= n:
            break
        ids = tok(text[:max_len * 16], add_special_tokens=False)["input_ids"]
        out += [win for win in (ids[:max_len], ids[max_len:2 * max_len]) if len(win) >= 32]
    return out[:n]


@torch.no_grad()
def teacher_forced(engine, seqs: list[tuple[list[int], int]], per_row, key: dict, cache: Path | None, label: str,
                   batch: int = 8, forward=None) -> list[dict]:
    """Each (ids, first) with what `per_row(h, ids, first)` (a dict) makes of the target's final hidden states h
    (len(ids), hidden) over that row (or of what `forward(input_ids)` returns, (B, L, ...), when given): one
    teacher-forced pass per row, in right-padded batches of similar length.
    Cached in `cache` (when given) per (ids, first) under `key`, saved as it goes; returns
    [{"ids", "first", **per_row(...)}] in the order of `seqs`."""
    from tqdm import tqdm
    have = {}
    if cache is not None and cache.exists():
        saved = torch.load(cache)
        if saved.get("key") == key:
            have = saved["rows"]
    todo = sorted({(tuple(ids), first) for ids, first in seqs if (tuple(ids), first) not in have},
                  key=lambda x: len(x[0]))

    def save():
        if cache is not None:
            tmp = cache.with_name(cache.name + ".tmp")
            torch.save({"key": key, "rows": have}, tmp)
            tmp.replace(cache)
    last = time.time()
    for b in tqdm(range(0, len(todo), batch), desc=f"target passes ({label})", file=sys.stderr,
                  mininterval=10, disable=len(todo) < 64):
        part = todo[b:b + batch]
        L = max(len(ids) for ids, _f in part)
        x = torch.zeros(len(part), L, dtype=torch.long)
        for i, (ids, _f) in enumerate(part):
            x[i, :len(ids)] = torch.tensor(ids)       # right padding: causal attention never reads it
        x = x.to(engine.device)
        h = forward(x) if forward else D._decoder(engine.model)(input_ids=x, use_cache=False).last_hidden_state
        for i, (ids, first) in enumerate(part):
            have[(ids, first)] = per_row(h[i, :len(ids)], ids, first)
        if time.time() - last > 120:
            save()
            last = time.time()
    if todo:
        save()
    return [{"ids": list(ids), "first": first, **have[(tuple(ids), first)]} for ids, first in seqs]


def soft_labels(engine, seqs: list[tuple[list[int], int]], top: int, cache: Path, label: str,
                batch: int = 8) -> list[dict]:
    """The target's `top` most probable next tokens and their probabilities (over its full vocabulary) at every
    position from `first` to the second-to-last of each (ids, first): one teacher-forced pass per row instead of
    one sampled token, the draft's soft targets. Cached in `cache` per (ids, first), saved as it goes."""
    head = engine.model.get_output_embeddings()

    def top_k(h, ids, first):
        lp = torch.log_softmax(head(h[first:len(ids) - 1]).float(), -1)
        v, t = lp.topk(top, -1)
        return {"top_ids": t.to(torch.int32).cpu(), "top_p": v.exp().to(torch.float16).cpu()}
    return teacher_forced(engine, seqs, top_k, {"model": engine.name, "top": top}, cache, f"soft labels, {label}",
                          batch)


def soft_batches(groups: list[tuple[list[dict], float]], batch: int, rng: random.Random):
    """Endless batches mixing soft-labelled rows from `groups` [(rows, share)]: ids (B, L), the labelled
    (row, position) pairs, their top ids (N, K) and probabilities (N, K)."""
    shares = [s for _r, s in groups]
    while True:
        pick = [rng.choice(groups[rng.choices(range(len(groups)), shares)[0]][0]) for _ in range(batch)]
        L = max(len(r["ids"]) for r in pick)
        ids = torch.zeros(len(pick), L, dtype=torch.long)
        bi, bj, ti, tp = [], [], [], []
        for i, r in enumerate(pick):
            ids[i, :len(r["ids"])] = torch.tensor(r["ids"])
            n = len(r["top_ids"])
            bi.append(torch.full((n,), i, dtype=torch.long))
            bj.append(torch.arange(r["first"], r["first"] + n))
            ti.append(r["top_ids"])
            tp.append(r["top_p"])
        yield ids, torch.cat(bi), torch.cat(bj), torch.cat(ti).long(), torch.cat(tp).float()


def soft_loss(draft: D.Draft, ids, bi, bj, top_ids, top_p) -> torch.Tensor:
    """Cross-entropy of the draft against the target's top-K distribution restricted to the draft's kept
    vocabulary and renormalised there (positions whose top-K lies wholly outside it are skipped)."""
    h = draft.hidden(ids)[bi, bj]
    logq = torch.log_softmax(draft.kept_logits(h).float(), -1)
    kid = draft.to_kept(top_ids)
    p = top_p * (kid >= 0)
    s = p.sum(-1, keepdim=True)
    ok = s[:, 0] > 0
    p = p[ok] / s[ok]
    return -(p * logq[ok].gather(-1, kid[ok].clamp(min=0))).sum(-1).mean()


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
            seq, first = answer_span(r, max_len)
            h = draft.hidden(torch.tensor([seq]))[0]
            pred = draft.kept_ids[draft.kept_logits(h[first:len(seq) - 1]).argmax(-1)]
            tgt = torch.tensor(seq[first + 1:])
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


def soft_data(args, engine, rows: list[dict], work: Path) -> tuple[list, str]:
    """Soft-labelled training rows: the target's answers and `--corpus-windows` corpus windows, each position
    labelled with the target's top `--soft-top` next tokens (in `--teacher-dtype`). Returns the mixture's
    groups [(rows, share)] and a line for the card."""
    from ..engine import Engine
    dt = args.teacher_dtype
    teach = engine if dt == str(engine.dtype).replace("torch.", "") else Engine.load(args.model, dtype=dt)
    t0 = time.time()
    ans = soft_labels(teach, [answer_span(r, args.max_len) for r in rows], args.soft_top,
                      work / f"soft_answers_{dt}.pt", "answers")
    groups = [(ans, 1.0 - args.corpus_share if args.corpus_windows else 1.0)]
    if args.corpus_windows:
        wins = corpus_windows(teach, args.corpus_windows, args.max_len, args.seed)
        cor = soft_labels(teach, [(w, 0) for w in wins], args.soft_top, work / f"soft_corpus_{dt}.pt", "corpus")
        groups.append((cor, args.corpus_share))
    desc = (f"soft targets: the target's top-{args.soft_top} next-token probabilities ({dt}) at every answer "
            f"position" + (f", and at every position of {len(groups[-1][0])} windows of up to {args.max_len} tokens "
                           f"of the training corpus (standard-library text and its docstring conversations, "
                           f"training modules only), {args.corpus_share:.0%} of each batch" if args.corpus_windows
                           else "") + f"; labelling took {(time.time() - t0) / 60:.1f} min (0 when cached)")
    print(desc, file=sys.stderr, flush=True)
    return groups, desc


def train(args) -> Path:
    from ..engine import Engine, cpu_name
    torch.manual_seed(args.seed)
    engine = Engine.load(args.model, dtype="float32")
    out = Path(args.out) if args.out else D.shipped_dir(engine.name)
    work = Path(args.work) if args.work else ROOT / "data" / "work" / f"{engine.name}-distill"
    work.mkdir(parents=True, exist_ok=True)
    answerer = engine if args.answer_dtype == "float32" else Engine.load(args.model, dtype=args.answer_dtype)
    ans = TCH.answers(answerer, args.prompts, args.eval_prompts, args.seed, args.max_prompt, args.gen_tokens,
                      args.gen_batch, args.teacher_cache or args.work, args.sampled_prompts)
    del answerer
    rows, held, data_desc = ans.rows, ans.held, ans.description
    teacher_min = ans.minutes_for_card()
    if args.teacher_only:
        print(f"teacher data: {len(rows)} rows, {len(held)} held-out ({teacher_min} min)", file=sys.stderr)
        return work
    init = None
    if args.init:
        try:
            init = D.load(args.init, engine)
        except (OSError, ValueError) as e:
            raise SystemExit(f"--init: {e}") from e
        kept = init.kept_ids.tolist()                  # the vocabulary it was trained with
        layers_of_init = ",".join(str(s) for s in init.meta["source_layers"])
        print(f"--init: the draft's own shape (layers {layers_of_init}, {init.meta['intermediate_size']} MLP "
              f"neurons) and {len(kept)}-token vocabulary are kept", file=sys.stderr)
        args.layers, args.intermediate = layers_of_init, init.meta["intermediate_size"]
    else:
        kept = choose_vocab(rows, args.vocab, set(engine.eos_ids), corpus_fill(engine, args.fill_chars))
    cov = {"train": round(coverage(rows, kept), 4), "heldout": round(coverage(held, kept), 4)}
    print(f"vocabulary {len(kept)}: coverage of answer tokens train {cov['train']}, held-out {cov['heldout']}",
          file=sys.stderr)
    layers = [int(x) for x in args.layers.split(",")]
    ckpt = work / "draft_checkpoint.pt"
    st = checkpoint.load(ckpt)
    struct = {"layers": layers, "intermediate": args.intermediate, "kept": kept, "soft_top": args.soft_top,
              "corpus_windows": args.corpus_windows, "corpus_share": args.corpus_share,
              **({"init": str(Path(args.init).resolve())} if args.init else {})}
    if st is not None and st.get("struct") == struct:
        draft = D.Draft.from_state(engine, st["config"], st["draft"], kept)
        print(f"resuming from step {st['step']}", file=sys.stderr)
    elif init is not None:
        st, draft = None, init
        for p in draft.trainable():
            p.requires_grad_(True)
        print(f"continuing from {args.init} ({init.meta.get('steps')} steps)", file=sys.stderr)
    else:
        st = None
        calib = [torch.tensor([(list(r["prompt"]) + list(r["completion"]))[-args.max_len:]])
                 for r in rows[:args.calib_rows]]
        draft = D.Draft.from_target(engine, layers, args.intermediate, kept, calib)
    for prm in engine.model.parameters():
        prm.requires_grad_(False)
    params = draft.trainable()
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    run = {"step": 0, "curve": [], "elapsed": 0.0}
    if st is not None:
        opt.load_state_dict(st["opt"])
        run = {k: st[k] for k in run}
        torch.set_rng_state(st["torch_rng"])
    curve = run["curve"]
    rng = random.Random(args.seed * 1000 + run["step"])
    if args.soft_top:
        groups, soft_desc = soft_data(args, engine, rows, work)
        data_desc = f"{data_desc}; {soft_desc}"
        data = soft_batches(groups, args.batch, rng)
    else:
        data = batches(rows, args.batch, args.max_len, rng)

    def save(final=False):
        meta = {"base_model": engine.name, "trained_with": "python -m paradec train draft " + " ".join(args.argv),
                "steps": run["step"], "train_minutes": round(run["elapsed"] / 60, 2), "teacher_minutes": teacher_min,
                "hardware": f"{cpu_name()}, {torch.get_num_threads()} thread(s), {engine.device} "
                            f"({str(engine.dtype).replace('torch.', '')})",
                "data": data_desc, "vocab_coverage": cov, "lr": args.lr, "batch": args.batch,
                "max_len": args.max_len, "curve": curve, "complete": final,
                "init": ({"folder": args.init, "steps": init.meta.get("steps"),
                          "train_minutes": init.meta.get("train_minutes"),
                          "heldout": init.meta.get("heldout_acceptance")} if init is not None else None),
                "heldout_acceptance": curve[-1] if curve else None}
        draft.save(out, meta)
        checkpoint.save(ckpt, {"struct": struct, "config": draft.config_dict(), "draft": draft.state(),
                               "opt": opt.state_dict(), **run, "torch_rng": torch.get_rng_state()})

    def loss_fn():
        return (soft_loss(draft, *next(data)) if args.soft_top else step_loss(draft, *next(data))), {}

    if not curve:
        curve.append({"step": 0, **acceptance(draft, held, args.max_len)})
        print(curve[-1], file=sys.stderr, flush=True)
    checkpoint.run_steps(args, run, opt, params, loss_fn, lambda: acceptance(draft, held, args.max_len), save,
                         "draft")
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
             f"lr {cfg.get('lr')}" + (f", continuing a draft of {cfg['init'].get('steps')} steps "
                                      f"({cfg['init'].get('train_minutes')} min) from `{cfg['init'].get('folder')}`"
                                      if cfg.get("init") else ""),
             f"- Time: {TCH.time_text(cfg.get('train_minutes'), cfg.get('teacher_minutes'))}; "
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
    p.add_argument("--soft-top", type=int, default=0,
                   help="train on the target's top-K next-token probabilities at every position (one teacher-forced "
                        "pass per row) instead of its sampled tokens; 0 = the tokens")
    p.add_argument("--corpus-windows", type=int, default=0,
                   help="with --soft-top: also this many training-corpus windows labelled by the target")
    p.add_argument("--corpus-share", type=float, default=0.5, help="share of each batch drawn from those windows")
    p.add_argument("--teacher-dtype", default="bfloat16", help="dtype of the target when it labels (--soft-top)")
    p.add_argument("--prompts", type=int, default=288, help="training prompts answered by the target")
    TCH.add_cache_args(p)
    p.add_argument("--answer-dtype", default="float32",
                   help="dtype of the target when it answers the prompts (bfloat16: the dtype it decodes in on a "
                        "CPU with AMX or AVX512-BF16; the answers are cached per dtype)")
    p.add_argument("--init", help="continue from the draft in this folder (its weights, shape and vocabulary; "
                                  "a fresh optimiser and schedule)")
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
    p.add_argument("--threads", type=int)
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.soft_top < 0 or args.corpus_windows < 0:
        parser.error("--soft-top and --corpus-windows must be >= 0")
    if args.corpus_windows and not args.soft_top:
        parser.error("--corpus-windows needs --soft-top K: the corpus windows are labelled by the target's top-K")
    if not 0.0 < args.corpus_share < 1.0:
        parser.error(f"--corpus-share must lie strictly between 0 and 1, got {args.corpus_share}")
    args.argv = list(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    train(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
