"""Train a PTP adapter (`paradec.ptp`) for any Llama-style model: `python -m paradec train ptp --model M`.

Distillation (the default, O-PTP): the base model answers prompts - the training prompt set
(paradec.training.prompts, disjoint from evals/suites) or a prompt file given with --data - once with its
processed sampling distribution (the paper's T 0.7, top-k 50, top-p 0.95) and once greedily. At temperature 0
the argmax bin is all of [0, 1), so greedy completions teach the drafter what greedy `ptp` needs: the argmax
whatever u is. The answers to the training prompt set are cached (paradec.training.teacher,
data/work/<model>-teacher/) and shared with `train draft`; a --data run caches in <work>/.

Each training step takes a batch of prompt+completion rows, runs them through the frozen base once (no
gradient: it yields the KV cache and the teacher's distributions), picks `--blocks` block starts per row and
appends K = --block auxiliary slots per block. For the token t_k a slot targets, u is drawn inside its CDF bin
[F(t-1), F(t)) under the teacher's processed distribution, as lo + z (hi - lo) with z ~ Beta(0.3, 0.3) (bin
edges are where drafting is hardest). The slots then run through the model with the gated LoRA on,
attending to their context and their own block's earlier slots, and the loss is the cross-entropy of slot k
against t_k. Only the adapter (u embedding + LoRA) learns.

Teacher-free (--teacher-free, C-PTP): plain text instead of completions; u's of the data tokens come from the
base model's own CDF (temperature 1); slot k is shown u_1..u_{k-1} but not u_k and learns the distribution
of t_k.

Held-out tokens per pass: on held-out completions, u uniform inside each bin (the paper's evaluation), a
block's drafts of tokens 2..K are accepted up to the first wrong one, plus the base's token: the figure a
fused `ptp` pass gains with all branches. It is measured every --eval-every steps and stored in the adapter
config as "curve". Checkpoints every --ckpt-every steps (adapter, optimizer, step, curve) make an
interrupted run resume; the adapter folder is rewritten at every checkpoint.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

from .. import decoding
from .. import ptp as P
from ..sampling import SamplingParams, pick, process
from . import checkpoint
from . import teacher as TCH
from .teacher import TEACHER_SP, teacher_rows
PLAIN_SP = SamplingParams(1.0, 0, 1.0)


# ---------------------------------------------------------------- prompts

def _corpus():
    from . import corpus as C
    return C.build_corpus()


def file_prompts(engine, path: Path) -> list[list[int]]:
    """Prompts from a file: JSONL with "prompt" (raw text) or "messages", else one prompt per line (\\n escapes)."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            obj = json.loads(line)
            if obj.get("messages"):
                out.append(engine.encode_messages(obj["messages"]))
            elif obj.get("chat", True) and engine.has_chat_template:
                out.append(engine.encode_messages([{"role": "user", "content": obj["prompt"]}]))
            else:
                out.append(engine.tokenizer(obj["prompt"], add_special_tokens=True)["input_ids"])
        else:
            out.append(engine.tokenizer(line.replace("\\n", "\n"), add_special_tokens=True)["input_ids"])
    if not out:
        raise SystemExit(f"{path}: no prompts found")
    return out


def text_rows(engine, texts: list[str], seq: int, n: int, seed: int) -> list[dict]:
    """Teacher-free rows: n windows of `seq` tokens from texts (a short lead as context, the rest as targets)."""
    rng = random.Random(seed)
    ids = []
    for t in texts:
        ids.extend(engine.tokenizer(t, add_special_tokens=False)["input_ids"])
        ids.extend(sorted(engine.eos_ids)[:1])
    if len(ids) < seq + 1:
        raise SystemExit(f"not enough text for teacher-free training ({len(ids)} tokens; need > {seq})")
    rows = []
    for _ in range(n):
        s = rng.randrange(0, len(ids) - seq)
        rows.append({"prompt": ids[s:s + 8], "completion": ids[s + 8:s + seq], "greedy": False})
    return rows


# ---------------------------------------------------------------- teacher completions

@torch.inference_mode()
def generate(engine, prompts: list[list[int]], max_new: int, sp: SamplingParams, seed: int,
             batch: int = 16, progress=None) -> list[list[int]]:
    """Completions of `prompts` by the engine itself (batched, left-padded), ending at EOS (kept) or max_new."""
    return decoding.generate(engine, prompts, max_new, sp, seed, batch, progress)


# ---------------------------------------------------------------- batches

def _decoder(model):
    return model.base_model if model.base_model is not model else model.model


def build_batch(rows: list[dict], block: int, blocks, gen: random.Random, max_len: int) -> dict:
    """Right-padded real tokens plus the slot layout: for each row `blocks` random block starts in its completion,
    or with blocks="all" one block at every completion position (rows with fewer get dead blocks)."""
    B = len(rows)
    seqs, ends, dead = [], [], []
    for r in rows:
        prompt, comp = list(r["prompt"]), list(r["completion"])
        keep = max(1, max_len - block - len(comp))
        prompt = prompt[-keep:]
        seq = (prompt + comp)[:max_len - block]
        n_comp = len(seq) - len(prompt)
        if blocks == "all":
            starts = list(range(max(1, n_comp)))
        else:
            starts = [gen.randrange(0, max(1, n_comp)) for _ in range(blocks)]
        seqs.append(seq)
        ends.append([len(prompt) - 1 + s for s in starts])      # index of each block's last context token
    n_blocks = max(len(e) for e in ends)
    for e in ends:                                              # pad with dead blocks (no targets)
        dead.append(len(e))
        e.extend([e[0]] * (n_blocks - len(e)))
    L = max(len(s) for s in seqs)
    Q = n_blocks * block
    ids = torch.zeros(B, L, dtype=torch.long)
    pred = torch.zeros(B, Q, dtype=torch.long)        # real index whose distribution each slot's target has
    target = torch.full((B, Q), -100, dtype=torch.long)
    pos = torch.zeros(B, Q, dtype=torch.long)
    allowed = torch.zeros(B, Q, L + Q, dtype=torch.bool)
    tri = torch.ones(block, block, dtype=torch.bool).tril()
    for i, (seq, es) in enumerate(zip(seqs, ends)):
        ids[i, :len(seq)] = torch.tensor(seq)
        for b, e in enumerate(es):
            q = slice(b * block, (b + 1) * block)
            a = torch.arange(block)
            pos[i, q] = e + a
            pred[i, q] = (e + a).clamp_max(len(seq) - 1)
            t = e + 1 + a
            seq_t = torch.tensor(seq)
            live = (t < len(seq)) & (b < dead[i])
            target[i, q] = torch.where(live, seq_t[t.clamp_max(len(seq) - 1)], torch.full_like(t, -100))
            allowed[i, q, :e + 1] = True
            allowed[i, q, L + b * block:L + (b + 1) * block] = tri
    greedy = torch.tensor([bool(r["greedy"]) for r in rows])
    return {"ids": ids, "pred": pred, "target": target, "pos": pos, "allowed": allowed, "greedy": greedy,
            "block": block, "L": L}


def slot_bins(logits: torch.Tensor, target: torch.Tensor, greedy: torch.Tensor, sp: SamplingParams):
    """CDF bins [lo, hi) of each target token under the processed teacher distribution. logits (B, Q, V)."""
    B, Q, V = logits.shape
    lo = torch.zeros(B, Q, dtype=torch.float64)
    hi = torch.zeros(B, Q, dtype=torch.float64)
    t = target.clamp_min(0).to(logits.device)
    for g in (False, True):
        rows = (greedy == g).nonzero().flatten()
        if len(rows) == 0:
            continue
        probs = process(logits[rows], SamplingParams() if g else sp).double()
        cdf = probs.cumsum(-1) / probs.sum(-1, keepdim=True)
        hi_g = cdf.gather(-1, t[rows].unsqueeze(-1)).squeeze(-1)
        lo_g = hi_g - (probs / probs.sum(-1, keepdim=True)).gather(-1, t[rows].unsqueeze(-1)).squeeze(-1)
        lo[rows], hi[rows] = lo_g.clamp_min(0).cpu(), hi_g.clamp_max(1).cpu()
    valid = (target >= 0) & (hi > lo)
    return lo, hi, valid


def draw_u(lo, hi, gen: torch.Generator, beta: bool) -> torch.Tensor:
    if beta:
        z = torch.distributions.Beta(0.3, 0.3).sample(lo.shape)   # uses torch's global RNG (seeded by train)
    else:
        z = torch.rand(lo.shape, generator=gen, dtype=torch.float64)
    u = lo + z.double() * (hi - lo)
    return u.clamp(0.0, float(torch.tensor(1.0).nextafter(torch.tensor(0.0))))


def slot_embeds(ad: P.PTPAdapter, u: torch.Tensor, greedy: torch.Tensor, block: int) -> torch.Tensor:
    """(B, Q) u's -> (B, Q, hidden) slot inputs (O: u_k at slot k; C: u_{k-1}, slot 1 the start vector)."""
    B, Q = u.shape
    g = greedy[:, None].expand(B, Q)
    if ad.mode == "O":
        return ad.embed_u(u.float(), g.to(ad.u_base.device))
    ub = u.view(B, Q // block, block)
    shifted = torch.cat([torch.zeros_like(ub[..., :1]), ub[..., :-1]], -1).reshape(B, Q)
    start = torch.zeros(B, Q // block, block, dtype=torch.bool)
    start[..., 0] = True
    return ad.embed_u(shifted.float(), g.to(ad.u_base.device), start.reshape(B, Q).to(ad.u_base.device))


def forward_slots(engine, ad: P.PTPAdapter, batch: dict, sp: SamplingParams, u_gen: torch.Generator,
                  beta: bool, grad: bool):
    """Base pass over the real tokens (no grad), bins, then the slots with the LoRA. -> (slot logits, batch)."""
    model = engine.model
    dev = engine.device
    dec, head = _decoder(model), model.get_output_embeddings()
    ids = batch["ids"].to(dev)
    cache = engine.new_cache()
    with torch.no_grad():
        h = dec(input_ids=ids, past_key_values=cache, use_cache=True).last_hidden_state
        idx = batch["pred"].to(dev)
        teach = head(h.gather(1, idx.unsqueeze(-1).expand(-1, -1, h.shape[-1]))).float()
    lo, hi, valid = slot_bins(teach, batch["target"], batch["greedy"], sp)
    u = draw_u(lo, hi, u_gen, beta)
    emb = slot_embeds(ad, u, batch["greedy"], batch["block"]).to(engine.dtype)
    mask = engine.additive(batch["allowed"].to(dev))          # (B, 1, Q, L + Q)
    ctx = torch.enable_grad() if grad else torch.no_grad()
    with ctx, ad.gated("all"):
        hs = dec(inputs_embeds=emb, past_key_values=cache, position_ids=batch["pos"].to(dev),
                 attention_mask=mask, use_cache=True).last_hidden_state
        logits = head(hs).float()
    return logits, valid.to(dev), u, teach


def loss_fn(logits, batch, valid) -> torch.Tensor:
    tgt = batch["target"].to(logits.device).masked_fill(~valid, -100)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1),
                                             ignore_index=-100)


def batch_loss(engine, ad: P.PTPAdapter, batch: dict, sp: SamplingParams, u_gen: torch.Generator) -> torch.Tensor:
    """The training loss of one batch (u ~ Beta(0.3, 0.3) inside each bin), with its graph."""
    logits, valid, _u, _t = forward_slots(engine, ad, batch, sp, u_gen, beta=True, grad=True)
    return loss_fn(logits, batch, valid)


def train_step(engine, ad: P.PTPAdapter, opt, batch: dict, sp: SamplingParams, u_gen: torch.Generator) -> float:
    """One optimizer step on one batch. Returns the loss."""
    loss = batch_loss(engine, ad, batch, sp, u_gen)
    checkpoint.optimizer_step(loss, list(ad.parameters()), opt)
    return float(loss.detach())


def eval_rows(held: list[dict], n: int, tokens: int) -> list[dict]:
    """n held-out rows per mode (greedy, sampled), evenly spread over the set (it is ordered by prompt length),
    completions cut to their first `tokens` tokens; n <= 0: all rows. Each held-out row costs a pass over
    `tokens` blocks of slots with a full-vocabulary head, so the curve uses few and the final figure more."""
    out = []
    for g in (True, False):
        sel = [r for r in held if bool(r["greedy"]) == g and r["completion"]]
        if 0 < n < len(sel):
            sel = [sel[round(i * (len(sel) - 1) / max(1, n - 1))] for i in range(n)]
        out += [{**r, "completion": list(r["completion"])[:tokens]} for r in sel]
    return out


def evaluate_by_kind(engine, ad, rows: list[dict], block: int, sp: SamplingParams) -> dict:
    """Greedy held-out tokens per pass for each prompt kind of `rows` (rows carry "kind")."""
    kinds = sorted({r.get("kind", "?") for r in rows if r["greedy"]})
    return {k: evaluate(engine, ad, [r for r in rows if r["greedy"] and r.get("kind", "?") == k], block, sp)
            .get("greedy") for k in kinds}


@torch.no_grad()
def evaluate(engine, ad, rows: list[dict], block: int, sp: SamplingParams, seed: int = 1234,
             small_k: int = 4) -> dict:
    """Held-out tokens per pass, as `ptp` decoding with every branch would get them on these completions.

    For each held-out completion a block is drafted at every position (u uniform inside each token's bin);
    then the decoding trajectory is walked: the prefill pass gives the first token, and each later pass gives
    1 + the leading correct drafts of the block at its position. tokens / passes is reported per mode for
    k = block - 1 drafts ("greedy", "sampled") and for k = small_k ("greedy_k4", ...). Walking the trajectory
    matters: averaging over all positions would over-weight easy stretches, which a decoder crosses in few
    passes."""
    gen = random.Random(seed)
    u_gen = torch.Generator().manual_seed(seed)
    res = {}
    for greedy in (True, False):
        sel = [r for r in rows if bool(r["greedy"]) == greedy and r["completion"]]
        if not sel:
            continue
        tot = {block - 1: [0, 0], small_k: [0, 0]}
        for r in sel:
            batch = build_batch([r], block, "all", gen, 448)
            logits, valid, u, _teach = forward_slots(engine, ad, batch, sp, u_gen, beta=False, grad=False)
            if ad.mode == "O" or greedy:
                draft = logits.argmax(-1)
            else:
                draft = pick(process(logits, sp), u.to(logits.device))
            ok = ((draft == batch["target"].to(draft.device)) & valid)[0].view(-1, block)
            n = min(len(r["completion"]), ok.shape[0])
            for k in tot:
                lead = ok[:n, 1:k + 1].long().cumprod(-1).sum(-1).tolist()
                toks, passes, i = 1, 1, 0                # the prefill pass: the first token, drafts at 0
                while i + 1 < n:
                    g = min(lead[i] + 1, n - 1 - i)
                    toks, passes, i = toks + g, passes + 1, i + g
                tot[k][0] += toks
                tot[k][1] += passes
        name = "greedy" if greedy else "sampled"
        res[name] = round(tot[block - 1][0] / tot[block - 1][1], 4)
        res[f"{name}_k{small_k}"] = round(tot[small_k][0] / tot[small_k][1], 4)
    return res


# ---------------------------------------------------------------- the run

def init_from(ad: P.PTPAdapter, folder: Path, engine) -> None:
    """Start `ad` from the adapter in `folder` (a longer run on top of an earlier one): it must fit the model and
    have `ad`'s structure. What it had been trained with is kept in ad.meta["init"] for the card."""
    src = P.PTPAdapter.load(folder, engine.model, name=engine.name)
    if structure(src) != structure(ad):
        diff = {k: (v, structure(ad)[k]) for k, v in structure(src).items() if k != "modules" and v != structure(ad)[k]}
        raise SystemExit(f"--init {folder}: its structure differs from this run's ({diff or 'modules'}); "
                         "give the same --rank and --block")
    ad.load_state_dict(src.state_dict())
    m = src.meta
    ad.meta["init"] = {"folder": str(folder), "steps": m.get("steps", 0) + (m.get("init") or {}).get("steps", 0),
                       "train_minutes": round(m.get("train_minutes", 0) + (m.get("init") or {}).get("train_minutes", 0), 2),
                       "trained_with": m.get("trained_with"), "hardware": m.get("hardware"),
                       "heldout_tokens_per_pass": m.get("heldout_tokens_per_pass")}


def structure(ad: P.PTPAdapter) -> dict:
    """What a checkpoint must match to be resumed (not the run's metadata)."""
    return {"rank": ad.rank, "alpha": ad.alpha, "block": ad.block, "mode": ad.mode, "modules": ad.names,
            "hidden": ad.hidden}


def train(args) -> Path:
    from ..engine import Engine, cpu_name
    torch.manual_seed(args.seed)
    engine = Engine.load(args.model, device=args.device, dtype=args.dtype)
    for prm in engine.model.parameters():
        prm.requires_grad_(False)
    out = Path(args.out) if args.out else P.default_adapter_dir(engine) or Path(f"{engine.name}-ptp")
    work = Path(args.work) if args.work else Path(__file__).resolve().parents[2] / "data" / "work" / \
        f"{engine.name}-ptp{'-c' if args.teacher_free else ''}"
    work.mkdir(parents=True, exist_ok=True)
    max_len = min(engine.context_length, args.max_len)
    t0 = time.time()
    ans = None                      # the shared training-prompt answers, when those are the data
    if args.teacher_free:
        sp = PLAIN_SP
        if args.data:
            text = Path(args.data).read_text(encoding="utf-8")
            cut = int(len(text) * 0.95)
            tr_texts, va_texts = [text[:cut]], [text[cut:]]
        else:
            corp = _corpus()
            tr_texts, va_texts = corp.train_raw, corp.val_raw
        rows = text_rows(engine, tr_texts, args.gen_tokens + 8, 4 * args.prompts, args.seed)
        held = text_rows(engine, va_texts, args.gen_tokens + 8, args.eval_prompts, args.seed + 1)
        data_desc = f"teacher-free (C-PTP): {'text of ' + str(args.data) if args.data else 'default corpus text'}"
    else:
        sp = TEACHER_SP
        if args.data:
            prompts = file_prompts(engine, Path(args.data))
            random.Random(args.seed).shuffle(prompts)
            n_held = max(1, min(args.eval_prompts, len(prompts) // 10))
            tr_p, va_p = prompts[n_held:] or prompts, prompts[:n_held]
            rows = teacher_rows(engine, tr_p, args.gen_tokens, args.seed, work / "teacher.pt", "train",
                                args.gen_batch)
            held = teacher_rows(engine, va_p, args.gen_tokens, args.seed + 7, work / "teacher_heldout.pt",
                                "held-out", args.gen_batch)
            data_desc = (f"distillation: {len(tr_p)} prompts from {args.data}, one sampled (T 0.7, top-k 50, "
                         f"top-p 0.95) and one greedy completion each, up to {args.gen_tokens} tokens; "
                         f"{len(va_p)} held-out prompts")
        else:
            ans = TCH.answers(engine, args.prompts, args.eval_prompts, args.seed, args.max_prompt, args.gen_tokens,
                              args.gen_batch, args.teacher_cache or (work if args.work else None))
            rows, held, data_desc = ans.rows, ans.held, "distillation: " + ans.description
    teacher_min = ans.minutes_for_card() if ans is not None else round((time.time() - t0) / 60, 2)

    ckpt = work / "checkpoint.pt"
    ad = P.PTPAdapter.for_model(engine.model, rank=args.rank, block=args.block,
                                mode="C" if args.teacher_free else "O")
    opt = torch.optim.AdamW([q for q in ad.parameters()], lr=args.lr, weight_decay=0.0)
    run = {"step": 0, "curve": [], "elapsed": 0.0}
    st = checkpoint.load(ckpt)
    if args.init and st is None:             # a resumed run has the started-from adapter's record in its checkpoint
        init_from(ad, Path(args.init), engine)
    if st is not None:
        if st["config"] == structure(ad):
            ad.load_state_dict(st["adapter"])
            opt.load_state_dict(st["opt"])
            run = {k: st[k] for k in run}
            if st.get("init"):
                ad.meta["init"] = st["init"]
            torch.set_rng_state(st["torch_rng"])
            print(f"resuming from step {run['step']} ({ckpt})", file=sys.stderr)
    ad.attach(engine.model)
    gen = random.Random(args.seed * 1000 + run["step"])
    u_gen = torch.Generator().manual_seed(args.seed + run["step"])
    curve = run["curve"]

    def save(final=False):
        ad.meta.update({
            "base_model": engine.name,
            "trained_with": "python -m paradec train ptp " + " ".join(args.argv),
            "steps": run["step"], "train_minutes": round(run["elapsed"] / 60, 2), "teacher_minutes": teacher_min,
            "hardware": f"{cpu_name()} {engine.device}, {engine.dtype}, "
                        f"{torch.get_num_threads()} thread(s)".strip(),
            "data": data_desc, "teacher_sampling": {"temperature": sp.temperature, "top_k": sp.top_k,
                                                    "top_p": sp.top_p},
            "lr": args.lr, "batch": args.batch, "blocks_per_row": args.blocks,
            "curve": curve, "heldout_tokens_per_pass": curve[-1] if curve else None, "complete": final})
        ad.save(out)
        checkpoint.save(ckpt, {"config": structure(ad), "adapter": ad.state_dict(),
                          "opt": opt.state_dict(), **run,
                          "init": ad.meta.get("init"),
                          "torch_rng": torch.get_rng_state()})

    curve_rows = eval_rows(held, args.eval_rows, args.eval_tokens)
    if not curve:
        ev = evaluate(engine, ad, curve_rows, args.block, sp)
        curve.append({"step": 0, **ev})
    checkpoint.run_steps(
        args, run, opt, list(ad.parameters()),
        lambda: (batch_loss(engine, ad, build_batch([gen.choice(rows) for _ in range(args.batch)], args.block,
                                                    args.blocks, gen, max_len), sp, u_gen), {}),
        lambda: evaluate(engine, ad, curve_rows, args.block, sp), save, "ptp")
    if args.final_eval_rows:
        te = time.time()
        fin = eval_rows(held, args.final_eval_rows, args.eval_tokens)
        ad.meta["final_eval"] = {"rows_per_mode": args.final_eval_rows, "tokens": args.eval_tokens,
                                 **evaluate(engine, ad, fin, args.block, sp),
                                 "greedy_by_kind": evaluate_by_kind(engine, ad, fin, args.block, sp)}
        print(json.dumps(ad.meta["final_eval"]), file=sys.stderr, flush=True)
        run["elapsed"] += time.time() - te
    save(final=True)
    write_card(out, ad.file_config())
    print(f"wrote {out}", file=sys.stderr)
    return out


def write_card(folder: Path, cfg: dict) -> Path:
    """A short README.md card for the adapter, with this run's own figures."""
    curve = cfg.get("curve") or []
    last = curve[-1] if curve else {}
    lines = [f"# PTP adapter for `{cfg.get('base_model')}`", "",
             "Parallel Token Prediction (Draxler et al., arXiv 2512.21323) adapter for paradec's `ptp` strategy: "
             f"u embedding (32 float bits -> Linear) and gated LoRA rank {cfg['rank']} on "
             f"{len(cfg['modules'])} linears, applied only at auxiliary slots "
             f"({'O-PTP, distilled' if cfg['mode'] == 'O' else 'C-PTP, teacher-free'}).",
             "", f"- Trained with: `{cfg.get('trained_with')}`",
             f"- Data: {cfg.get('data')}",
             *([f"- Started from an earlier adapter ({cfg['init'].get('steps')} steps, "
                f"{cfg['init'].get('train_minutes')} min on {cfg['init'].get('hardware')}; held-out figure then "
                f"{(cfg['init'].get('heldout_tokens_per_pass') or {}).get('greedy')} greedy), trained with "
                f"`{cfg['init'].get('trained_with')}`"] if cfg.get("init") else []),
             f"- Steps: {cfg.get('steps')} (batch {cfg.get('batch')} rows x {cfg.get('blocks_per_row')} blocks of "
             f"{cfg['block']} slots), lr {cfg.get('lr')}",
             f"- Time: {TCH.time_text(cfg.get('train_minutes'), cfg.get('teacher_minutes'))}; "
             f"hardware: {cfg.get('hardware')}",
             f"- Held-out tokens per pass (the decoding trajectory walked on held-out teacher completions, "
             f"prefill pass included; every branch drafted): k = {cfg['block'] - 1} drafts per pass: greedy "
             f"{last.get('greedy')}, sampled {last.get('sampled')}; k = 4: greedy {last.get('greedy_k4')}, "
             f"sampled {last.get('sampled_k4')}"]
    fin = cfg.get("final_eval")
    if fin:
        lines += [f"- Final held-out figure ({fin['rows_per_mode']} rows per mode, first {fin['tokens']} tokens of "
                  f"each answer): greedy {fin.get('greedy')}, sampled {fin.get('sampled')}; k = 4: greedy "
                  f"{fin.get('greedy_k4')}, sampled {fin.get('sampled_k4')}",
                  "- Greedy, by prompt kind: " + ", ".join(f"{k} {v}" for k, v in fin["greedy_by_kind"].items())]
    lines += ["", "The curve (held-out rows of the curve only):", "",
              "| step | loss | greedy | sampled | greedy k=4 | sampled k=4 |", "|---|---|---|---|---|---|"]
    for c in curve:
        lines.append(f"| {c.get('step')} | {c.get('loss', '')} | {c.get('greedy')} | {c.get('sampled')} | "
                     f"{c.get('greedy_k4')} | {c.get('sampled_k4')} |")
    lines += ["", "Decoding is lossless whatever the adapter's quality: every drafted token is verified by the "
              "base model with the same u (coupled verification)."]
    path = Path(folder) / "README.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m paradec train ptp",
                                description="Train a Parallel Token Prediction adapter for a model.")
    p.add_argument("--model", default=None, help="model folder, hub id, or paradec-tiny (default: Qwen2.5-Coder-0.5B-Instruct)")
    p.add_argument("--data", help="prompt file (JSONL prompt/messages or one per line); with --teacher-free: text")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--rank", type=int, default=32)
    p.add_argument("--block", type=int, default=16, help="auxiliary slots per block (K)")
    p.add_argument("--out", help="adapter folder (default: the shipped location data/adapters/<model>/ptp for a "
                                 "model paradec knows, else <model>/ptp)")
    p.add_argument("--work", help="teacher cache and checkpoint folder (default data/work/<model>-ptp)")
    p.add_argument("--init", help="start from the adapter in this folder (same --rank and --block) instead of "
                                  "from scratch: a longer run on top of an earlier one")
    p.add_argument("--teacher-free", action="store_true", help="C-PTP from plain text, no teacher completions")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--blocks", type=int, default=4, help="blocks per row per step")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--prompts", type=int, default=288, help="training prompts for teacher completions")
    p.add_argument("--eval-prompts", type=int, default=36)
    p.add_argument("--max-prompt", type=int, default=320, help="prompt tokens kept (the tail)")
    p.add_argument("--max-len", type=int, default=512, help="tokens of a training row (context + completion + slots)")
    p.add_argument("--gen-tokens", type=int, default=128, help="tokens per teacher completion")
    p.add_argument("--gen-batch", type=int, default=48, help="rows per batched teacher generation")
    p.add_argument("--teacher-cache", help="folder of the target's cached answers (default data/work/<model>-teacher"
                                           ", shared with `train draft`; --work when that is given)")
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--eval-rows", type=int, default=4, help="held-out rows per mode for the curve (0: all)")
    p.add_argument("--eval-tokens", type=int, default=64, help="held-out completion tokens evaluated per row")
    p.add_argument("--final-eval-rows", type=int, default=0,
                   help="held-out rows per mode for a final figure by prompt kind (0: none)")
    p.add_argument("--ckpt-every", type=int, default=25)
    p.add_argument("--max-minutes", type=float, help="stop (and save) after this much wall time")
    p.add_argument("--threads", type=int, help="CPU threads for torch")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    return p


def train_ptp_main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.block < 2:
        raise SystemExit("--block must be at least 2")
    train(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(train_ptp_main(sys.argv[1:]))
