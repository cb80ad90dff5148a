"""Train Lexical Unit Decoding parameters for a model: `python -m paradec train lud --model M`.

Data (the "lexical unit" rule)
------------------------------
Two sources (`--data`):

* `teacher` (the command's default): the target's own answers to the training prompt set
  (paradec.training.teacher, shared with `train ptp` and `train draft`: 288 chat prompts made from the
  standard library, disjoint from evals/suites, one sampled and one greedy answer each). A window is a
  prompt and its answer (the last `--window` tokens); cut points fall inside the answer only, so the pad
  slots learn to continue what the model itself says, which is what they do at decoding time.
* `corpus`: token windows of `--window` tokens drawn from the default corpus (paradec.training.corpus: raw
  standard-library text and the chat examples rendered with the model's chat template) plus, with
  `--greedy N`, the base model's own greedy answers to N training chat questions.

For every window x_0..x_{L-1} one no-grad base forward pass gives the teacher-forced confidence
c_t = p_base(x_t | x_<t) of each token.

A training example is a cut point i (1 <= i <= L-2: the real tokens x_0..x_{i-1} are visible, the base
predicts x_i at position i-1) followed by k-1 pad slots at positions i..i+k-2. The label of pad slot j
(j = 1..k-1), which predicts the token j places after x_i, is

* x_{i+j}      if c_i, c_{i+1}, ..., c_{i+j} are all > alpha  (x_i..x_{i+j} form a lexical unit: tokens the
                base model predicts confidently in a row; with alpha >= 0.5 each is the base's greedy choice),
* STOP          for the first slot where that fails (STOP = the adapter's extra output class, index
                vocab_size, see paradec/lud.py; decoding never accepts it, so the adapter learns to say "the
                unit ends here" rather than guess, and its confidences stay honest),
* ignored       for the slots after that, and for slots past the window's end.

Cut points: `pos_fraction` (3/4) are drawn among positions that start a unit of at least two tokens
(c_i, c_{i+1} > alpha), the rest uniformly, `--cuts` per window; STOP labels weigh `stop_weight` (1/2) in
the loss, unit tokens 1 (STOP labels would otherwise dominate and the adapter would learn to stop always).
All cut points of a window share one forward pass: the real tokens are run once without gradient into a KV cache (their logits give c_t), then all pad groups are run after
that cache with a mask where slot j of group g sees x_0..x_{i_g-1} and slots 1..j of its own group.

Model: the gated LoRA + pad embedding of paradec/lud.py (real positions keep the base weights exactly).
Loss: mean cross-entropy over the labelled pad slots. AdamW, cosine schedule, checkpoint every
`--ckpt-every` steps (model, optimizer, RNG, step) so an interrupted run resumes; the parameters are
written to `--out` (default <model>/lud/) with a README card.
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .. import decoding
from ..adapters import base_record, base_signature
from ..lud import LUDAdapter, LUDConfig, pad_group_mask
from . import checkpoint

IGNORE = -100


@dataclass
class LUDTrainConfig:
    k: int = 4
    alpha: float = 0.9
    steps: int = 300
    rank: int = 16
    scale: float = 2.0
    batch: int = 4
    window: int = 192
    cuts: int = 48
    lr: float = 2e-3
    warmup: int = 20
    greedy: int = 64
    greedy_tokens: int = 80
    chat_fraction: float = 0.5
    seed: int = 0
    ckpt_every: int = 20
    max_docs: int = 0          # 0 = the whole corpus
    targets: str = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
    pos_fraction: float = 0.75  # share of cut points drawn among unit starts
    stop_weight: float = 0.5    # loss weight of STOP labels (they outnumber unit tokens)
    data: str = "corpus"        # "corpus" (stdlib text + greedy answers) or "teacher" (the target's answers)
    eval_every: int = 0         # held-out acceptance figures every n steps (teacher data; 0 = at the end only)
    eval_rows: int = 8          # held-out greedy answers for the figures taken during training
    prompts: int = 288          # training prompts the teacher answers (--data teacher; the cache answers new ones only)
    init: str = ""              # start from the LUD parameters in this folder (same k, rank and targets)
    sampled_prompts: int | None = None   # only the first N training prompts get a sampled answer too (teacher data)
    teacher_cache: str = ""     # folder of the target's cached answers (default data/work/<model>-teacher)


# ---------------------------------------------------------------- labels

def unit_labels(tokens: torch.Tensor, conf: torch.Tensor, cuts: list[int], slots: int, alpha: float,
                stop_id: int) -> torch.Tensor:
    """Labels (len(cuts) * slots,) for the pad slots of each cut (the rule in the module docstring).

    tokens: (L,) window; conf: (L,) with conf[t] = p_base(tokens[t] | tokens[:t]) (conf[0] unused).
    """
    L = len(tokens)
    labels = torch.full((len(cuts), slots), IGNORE, dtype=torch.long)
    for g, i in enumerate(cuts):
        ok = bool(conf[i] > alpha)
        for j in range(1, slots + 1):
            if i + j > L - 1:
                break
            ok = ok and bool(conf[i + j] > alpha)
            if ok:
                labels[g, j - 1] = int(tokens[i + j])
            else:
                labels[g, j - 1] = stop_id
                break
    return labels.view(-1)


def choose_cuts(conf: torch.Tensor, n: int, alpha: float, rng: random.Random, pos_fraction: float = 0.75,
                lo: int = 1) -> list[int]:
    """Cut points in lo..L-2 (lo: the first position whose token may be predicted, e.g. an answer's first)."""
    L = len(conf)
    lo = max(1, lo)
    starts = [i for i in range(lo, L - 2) if conf[i] > alpha and conf[i + 1] > alpha]
    pool = list(range(lo, L - 1))
    n_pos = min(len(starts), int(n * pos_fraction))
    cuts = set(rng.sample(starts, n_pos)) if n_pos else set()
    rest = [i for i in pool if i not in cuts]
    cuts |= set(rng.sample(rest, min(len(rest), n - len(cuts))))
    return sorted(cuts)


# ---------------------------------------------------------------- text

def _chats(cfg: LUDTrainConfig, corp=None) -> list[list[dict]]:
    """The training chat conversations in the order their greedy answers are made."""
    from . import corpus as C
    chats = list((corp or C.build_corpus()).train_chat)
    random.Random(cfg.seed + 1).shuffle(chats)
    return chats


def _token_streams(engine, cfg: LUDTrainConfig, log) -> tuple[dict[str, list[int]], list]:
    """(token streams, chats): streams 'raw' and 'chat' from the default corpus (shuffled documents, eos
    between them), and the chat conversations (for greedy answers)."""
    from . import corpus as C
    tok = engine.tokenizer
    corp = C.build_corpus()
    rng = random.Random(cfg.seed)
    raw = list(corp.train_raw)
    chats = list(corp.train_chat)
    rng.shuffle(raw)
    rng.shuffle(chats)
    if cfg.max_docs:
        raw, chats = raw[:cfg.max_docs], chats[:cfg.max_docs * 10]
    eos = next(iter(engine.eos_ids), tok.eos_token_id)
    out: dict[str, list[int]] = {"raw": [], "chat": []}
    for t in raw:
        out["raw"] += tok(t, add_special_tokens=False)["input_ids"] + [eos]
    for c in chats:
        if engine.has_chat_template:
            text = tok.apply_chat_template(c, tokenize=False)
        else:
            text = "\n".join(m["content"] for m in c)
        out["chat"] += tok(text, add_special_tokens=False)["input_ids"] + [eos]
    log(f"corpus: raw {len(out['raw']):,} tokens, chat {len(out['chat']):,} tokens")
    return out, _chats(cfg, corp)


@torch.no_grad()
def greedy_texts(engine, chats: list[list[dict]], n: int, max_new: int, batch: int = 16) -> list[list[int]]:
    """Prompt + the base model's greedy answer, as token lists, for the first n chat conversations."""
    rows = []
    for c in chats:
        if len(rows) >= n:
            break
        if c and c[-1]["role"] == "assistant":
            rows.append(engine.encode_messages(c[:-1]))
    return [p + g for p, g in zip(rows, decoding.generate(engine, rows, max_new, batch=batch))]


# ---------------------------------------------------------------- held-out figures

EVAL_THRESHOLDS = (0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.98)   # 0.3: lud-verified's default


@torch.no_grad()
def pad_predictions(engine, adapter: LUDAdapter, row: dict, window: int = 512):
    """Teacher-forced pad-slot predictions at every answer position of one row ({"prompt", "completion"}):
    (x (L,) the window's tokens, greedy (L,) the base's argmax for each position, cuts [lo..L-2], conf and top
    (len(cuts), k-1): the probability and class of each pad slot's top prediction, STOP included)."""
    ids, lo = answer_window(row["prompt"], row["completion"], window)
    x = torch.tensor(ids, device=engine.device)
    cuts = list(range(lo, len(ids) - 1))
    slots = adapter.config.k - 1
    if not cuts or slots < 1:
        return x.cpu(), None, [], None, None
    cache, _conf, greedy = base_pass(engine, x)
    probs = torch.softmax(pad_pass(engine, adapter, cache, len(ids), cuts, slots).float(), -1)
    conf, top = (t.view(len(cuts), slots).cpu() for t in probs.max(-1))
    return x.cpu(), greedy, cuts, conf, top


def replay_step(x, greedy, i: int, conf, top, k: int, threshold: float, stop: int) -> tuple[int, bool]:
    """(pad tokens greedy `lud` with this k and threshold accepts at cut i, whether any is wrong): slot j is
    accepted while its top class is not STOP and its probability exceeds the threshold; it is right when it is
    the base's greedy choice at i+j given the true prefix. Slots past the window's end are not replayed."""
    n, wrong = 0, False
    for j in range(1, k):
        if i + j >= len(x):
            break
        t = int(top[j - 1])
        if t == stop or float(conf[j - 1]) <= threshold:
            break
        n += 1
        wrong = wrong or t != int(greedy[i + j]) or int(x[i + j - 1]) != int(greedy[i + j - 1])
    return n, wrong


def replay_verified(x, greedy, cuts: list[int], conf, top, k: int, threshold: float, stop: int,
                    branch: bool = False) -> tuple[int, int]:
    """(tokens, passes) greedy `lud-verified` would take over one greedy answer (x == greedy on the answer),
    teacher-forced: a pass verifies its drafts against the base's greedy tokens (the longest matching prefix, then
    the base's own token); when all were accepted, the pad slots read after them (the cut at the next position)
    give the next pass's drafts by `replay_step`'s rule, else the next pass has none (with `branch`, the strategy's
    branch layout, the pads read after the accepted ones give them whether or not a draft was refused). The first
    pass is the prompt's (no drafts). With the answer as long as the request's budget, these are the strategy's own
    counts."""
    at = {c: g for g, c in enumerate(cuts)}
    end = len(x)                        # positions cuts[0] .. len(x) - 1 are the answer's tokens to emit
    s, drafts, tokens, passes = cuts[0], [], 0, 0
    while s < end:
        j = 0
        while j < len(drafts) and s + j < end and drafts[j] == int(greedy[s + j]):
            j += 1
        passes += 1
        tokens += min(j + 1, end - s)
        if (branch or j == len(drafts)) and s + j in at:
            c, g = s + j, at[s + j]
            n, _wrong = replay_step(x, greedy, c, conf[g], top[g], k, threshold, stop)
            drafts = [int(top[g][i]) for i in range(min(n, end - c - 2))]   # as the strategy: the last token
            #                                                                   is never a draft
        else:
            drafts = []
        s += j + 1
    return tokens, passes


def heldout_figures(engine, adapter: LUDAdapter, rows: list[dict], k: int, thresholds=EVAL_THRESHOLDS,
                    window: int = 512) -> list[dict]:
    """What greedy `lud` would do at every answer position of held-out rows, teacher-forced.

    rows: {"prompt", "completion", "kind"} (the target's greedy answers to held-out prompts). At every cut of
    an answer the step `lud` would take is replayed (`replay_step`) for each k' = 2..k and each threshold; a
    step with a wrong accepted token is where greedy lud's text would leave ar's. Returns one dict per (kind
    or "all", k', threshold): tokens per pass (1 + accepted, mean over cuts), the share of wrong steps, and
    the number of cuts; and what `lud-verified` (lossless) would do over the same answers (`replay_verified`):
    its tokens per pass in the chain and in the branch layout."""
    stop = adapter.config.stop_id
    acc: dict[tuple, list[float]] = {}
    for r in rows:
        x, greedy, cuts, conf, top = pad_predictions(engine, adapter, r, window)
        for kk in range(2, k + 1):
            for th in thresholds:
                keys = [(kind, kk, th) for kind in ("all", r.get("kind", "?"))]
                for g, i in enumerate(cuts):
                    n, wrong = replay_step(x, greedy, i, conf[g], top[g], kk, th, stop)
                    for key in keys:
                        a = acc.setdefault(key, [0.0, 0.0, 0, 0, 0, 0, 0])
                        a[0] += 1 + n
                        a[1] += wrong
                        a[2] += 1
                if cuts:
                    for b, branch in enumerate((False, True)):
                        tok, passes = replay_verified(x, greedy, cuts, conf, top, kk, th, stop, branch)
                        for key in keys:
                            acc[key][3 + 2 * b] += tok
                            acc[key][4 + 2 * b] += passes
    return [{"kind": kind, "k": kk, "threshold": th, "tokens_per_pass": round(a[0] / a[2], 4),
             "wrong_steps": round(a[1] / a[2], 4), "cuts": a[2],
             "verified_tokens_per_pass": round(a[3] / max(1, a[4]), 4),
             "verified_branch_tokens_per_pass": round(a[5] / max(1, a[6]), 4)}
            for (kind, kk, th), a in sorted(acc.items())]


def figures_markdown(figs: list[dict], kind: str = "all") -> str:
    """A table of held-out tokens per pass / wrong steps against k and threshold, for one kind; with what
    `lud-verified` would do (chain / branch tokens per pass) where the figures have it."""
    ks = sorted({f["k"] for f in figs if f["kind"] == kind})
    ths = sorted({f["threshold"] for f in figs if f["kind"] == kind})
    by = {(f["k"], f["threshold"]): f for f in figs if f["kind"] == kind}
    verified = all("verified_tokens_per_pass" in f for f in by.values())
    what = "lud tokens/pass, wrong steps; lud-verified tokens/pass chain / branch" if verified else \
        "tokens/pass, wrong steps"

    def cell(f):
        text = f"{f['tokens_per_pass']:.2f}, {100 * f['wrong_steps']:.1f}%"
        return text + (f"; {f['verified_tokens_per_pass']:.2f} / {f['verified_branch_tokens_per_pass']:.2f}"
                       if verified else "")
    out = ["| threshold | " + " | ".join(f"k={k}: {what}" for k in ks) + " |", "|---|" + "---|" * len(ks)]
    for th in ths:
        out.append(f"| {th} | " + " | ".join(cell(by[(k, th)]) for k in ks) + " |")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- training


def answer_window(prompt: list[int], completion: list[int], window: int) -> tuple[list[int], int]:
    """(the last `window` tokens of prompt + completion, the window index of the answer's first token)."""
    ids = list(prompt) + list(completion)
    start = max(0, len(ids) - window)
    return ids[start:], max(1, len(prompt) - start)


def sample_window(streams, greedy, cfg: LUDTrainConfig, rng: random.Random) -> tuple[list[int], int]:
    """(window, first position a cut may fall on)."""
    if streams is None:                       # teacher data: `greedy` holds (prompt, completion) pairs
        p, c = rng.choice(greedy)
        return answer_window(p, c, cfg.window)
    if greedy and rng.random() < 0.25:
        g = rng.choice(greedy)
        return g[-cfg.window:], 1
    kind = "chat" if rng.random() < cfg.chat_fraction and streams["chat"] else "raw"
    arr = streams[kind] or streams["raw"] or streams["chat"]
    start = rng.randrange(0, max(1, len(arr) - cfg.window))
    return arr[start:start + cfg.window], 1


@torch.no_grad()
def base_pass(engine, x: torch.Tensor):
    """(KV cache of the window, conf (L,) with conf[t] = p_base(x_t | x_<t), the base's argmax (L,) with
    greedy[t] = its choice for position t)."""
    cache = engine.new_cache()
    logits = engine.model(input_ids=x[None], past_key_values=cache, use_cache=True).logits[0, :-1].float()
    probs = torch.softmax(logits, -1)
    conf = torch.zeros(len(x))
    conf[1:] = probs.gather(-1, x[1:, None])[:, 0].cpu()
    greedy = torch.full((len(x),), -1, dtype=torch.long)
    greedy[1:] = logits.argmax(-1).cpu()
    return cache, conf, greedy


def pad_pass(engine, adapter: LUDAdapter, cache, L: int, cuts: list[int], slots: int):
    """Logits (Q, V+1) of every cut's pad slots after the window's cache (slot j of cut i at position i-1+j)."""
    model = engine.model
    Q = len(cuts) * slots
    ids = torch.full((1, Q), engine.pad_id, dtype=torch.long, device=engine.device)
    pos = torch.tensor([[i - 1 + j for i in cuts for j in range(1, slots + 1)]], device=engine.device)
    allowed = pad_group_mask(L, cuts, slots, device=engine.device)
    neg = torch.finfo(engine.dtype).min
    mask = torch.zeros(allowed.shape, dtype=engine.dtype, device=engine.device).masked_fill(~allowed, neg)[None, None]
    gate = torch.ones(1, Q, dtype=torch.bool)
    with adapter.applied(model, gate):
        out = model(input_ids=ids, past_key_values=cache, position_ids=pos, attention_mask=mask, use_cache=True)
    return out.logits[0]


def window_loss(engine, adapter: LUDAdapter, window: list[int], cfg: LUDTrainConfig, rng: random.Random,
                stop_id: int, lo: int = 1) -> tuple[torch.Tensor | None, dict]:
    """Loss of one window: base pass for confidences and the cache, then all pad groups with gradient."""
    x = torch.tensor(window, device=engine.device)
    L, slots = len(window), cfg.k - 1
    cache, conf, _ = base_pass(engine, x)
    cuts = choose_cuts(conf, cfg.cuts, cfg.alpha, rng, cfg.pos_fraction, lo)
    labels = unit_labels(x.cpu(), conf, cuts, slots, cfg.alpha, stop_id).to(engine.device)
    stats = {"labelled": int((labels != IGNORE).sum()), "unit": int(((labels != IGNORE) & (labels != stop_id)).sum()),
             "conf_frac": float((conf[1:] > cfg.alpha).float().mean())}
    if stats["labelled"] == 0:
        return None, stats
    logits = pad_pass(engine, adapter, cache, L, cuts, slots)
    per = torch.nn.functional.cross_entropy(logits.float(), labels, ignore_index=IGNORE, reduction="none")
    w = torch.where(labels == stop_id, cfg.stop_weight, 1.0) * (labels != IGNORE)
    loss = (per * w).sum() / w.sum()
    with torch.no_grad():
        sel = (labels != IGNORE)
        pred = logits.argmax(-1)[sel]
        stats["acc"] = float((pred == labels[sel]).float().mean())
        unit = labels[sel] != stop_id
        stats["unit_acc_n"] = (int((pred[unit] == labels[sel][unit]).sum()), int(unit.sum()))
    return loss, stats


def train_lud(engine, cfg: LUDTrainConfig, out_dir, work_dir=None, log=print, progress: bool = True) -> dict:
    """Train (or resume) LUD parameters for `engine`'s model; writes them to out_dir and returns a summary."""
    from tqdm import tqdm
    out_dir = Path(out_dir)
    own_work = work_dir is None
    work = Path(work_dir) if work_dir else out_dir / ".checkpoint"
    work.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    model = engine.model
    model.eval().requires_grad_(False)
    lcfg = LUDConfig(rank=cfg.rank, scale=cfg.scale, k=cfg.k, alpha=cfg.alpha, **base_record(model),
                     targets=[t.strip() for t in cfg.targets.split(",") if t.strip()])
    adapter = LUDAdapter(model, lcfg).to(engine.device).attach(model)
    stop_id = adapter.config.stop_id     # the STOP class: one past the vocabulary
    opt = torch.optim.AdamW(adapter.parameters(), lr=cfg.lr, weight_decay=0.0)
    rng = random.Random(cfg.seed)
    state = {"step": 0, "elapsed_s": 0.0, "history": []}
    ckpt = work / "lud_checkpoint.pt"
    data_file = work / "lud_data.pt"
    held: list[dict] = []
    described = None                        # what the teacher answers are (--data teacher)
    data = torch.load(data_file, weights_only=False) if data_file.exists() and cfg.data != "teacher" else {}
    if cfg.data == "teacher":
        from . import teacher as TCH
        ans = TCH.answers(engine, cfg.prompts, cache=cfg.teacher_cache or None,   # cached per target and dtype,
                          sampled_prompts=cfg.sampled_prompts)                  # shared with train ptp / draft
        data = {"streams": None, "greedy": [(r["prompt"], r["completion"]) for r in ans.rows]}
        held = [r for r in ans.held if r["greedy"]]
        described = ans.description
        log(f"data: {len(data['greedy'])} teacher answers ({ans.description}); {len(held)} held-out greedy answers")
    elif data.get("streams") is None or data.get("greedy") is None:
        # token streams depend on the tokenizer only, greedy answers on the model: a data file holding
        # streams and greedy=None (e.g. copied from a run on another checkpoint) gets its answers made here
        t0 = time.time()
        if data.get("streams") is None:
            data["streams"], chats = _token_streams(engine, cfg, log)
        else:
            chats = _chats(cfg)
        data["greedy"] = greedy_texts(engine, chats, cfg.greedy, cfg.greedy_tokens) if cfg.greedy else []
        torch.save(data, data_file)
        log(f"data: {len(data['greedy'])} greedy answers, built in {time.time() - t0:.0f}s")
    streams, greedy = data["streams"], data["greedy"]
    saved = checkpoint.resume(ckpt, adapter, opt, log)
    if saved is not None:
        rng.setstate(saved["rng"])
        state = saved["state"]
    elif cfg.init:                          # a resumed run keeps the record of what it started from in its state
        state["init"] = init_from(adapter, Path(cfg.init), model)
        log(f"started from {cfg.init} ({state['init']['steps']} steps)")
    n_params = sum(p.numel() for p in adapter.parameters())
    log(f"LUD adapter: {n_params / 1e6:.2f}M parameters, k={cfg.k}, alpha={cfg.alpha}, {cfg.steps} steps")
    adapter.train()
    bar = tqdm(total=cfg.steps, initial=state["step"], desc="train lud", file=sys.stderr, disable=not progress)
    t_last = time.time()
    recent: list[dict] = []
    while state["step"] < cfg.steps:
        step = state["step"]
        for g in opt.param_groups:
            g["lr"] = checkpoint.cosine_lr(step, cfg.lr, cfg.warmup, cfg.steps)
        losses, stats = [], []
        for _ in range(cfg.batch):
            window, lo = sample_window(streams, greedy, cfg, rng)
            loss, st = window_loss(engine, adapter, window, cfg, rng, stop_id, lo)
            stats.append(st)
            if loss is not None:
                (loss / cfg.batch).backward()
                losses.append(loss.item())
        torch.nn.utils.clip_grad_norm_(adapter.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        state["step"] += 1
        now = time.time()
        state["elapsed_s"] += now - t_last
        t_last = now
        rec = {"step": state["step"], "loss": sum(losses) / max(1, len(losses)),
               "acc": sum(s.get("acc", 0) for s in stats) / max(1, len(stats)),
               "unit_labels": sum(s["unit"] for s in stats), "labelled": sum(s["labelled"] for s in stats),
               "unit_hits": sum(s.get("unit_acc_n", (0, 0))[0] for s in stats)}
        recent.append(rec)
        bar.update(1)
        bar.set_postfix(loss=f"{rec['loss']:.3f}", acc=f"{rec['acc']:.2f}")
        if state["step"] % cfg.ckpt_every == 0 or state["step"] == cfg.steps:
            n = len(recent)
            state["history"].append({"step": state["step"], "loss": round(sum(r["loss"] for r in recent) / n, 4),
                                     "acc": round(sum(r["acc"] for r in recent) / n, 4),
                                     "unit_share": round(sum(r["unit_labels"] for r in recent)
                                                         / max(1, sum(r["labelled"] for r in recent)), 4),
                                     "unit_acc": round(sum(r["unit_hits"] for r in recent)
                                                       / max(1, sum(r["unit_labels"] for r in recent)), 4),
                                     "elapsed_s": round(state["elapsed_s"], 1)})
            recent = []
            if held and cfg.eval_every and state["step"] % cfg.eval_every == 0:
                figs = heldout_figures(engine, adapter, held[:cfg.eval_rows], cfg.k, (0.8, 0.9, 0.95))
                state.setdefault("curve", []).append({"step": state["step"], "figures": [f for f in figs if f["kind"] == "all"]})
                best = [f for f in figs if f["kind"] == "all" and f["threshold"] == 0.9]
                log(f"step {state['step']} held-out (threshold 0.9): " + ", ".join(
                    f"k={f['k']} {f['tokens_per_pass']:.2f} tok/pass {100 * f['wrong_steps']:.1f}% wrong" for f in best))
            checkpoint.save(ckpt, {"adapter": adapter.state_dict(), "opt": opt.state_dict(), "rng": rng.getstate(),
                                   "state": state, "config": asdict(cfg)})
            adapter.config.training = {"config": asdict(cfg), "history": state["history"],
                                       "steps_done": state["step"], "train_time_s": round(state["elapsed_s"], 1)}
            adapter.save(out_dir)
            t_last = time.time()
    bar.close()
    heldout = heldout_figures(engine, adapter, held, cfg.k) if held else []
    summary = {"config": asdict(cfg), "history": state["history"], "steps_done": state["step"],
               "curve": state.get("curve", []), "heldout": heldout, "heldout_rows": len(held),
               "train_time_s": round(state["elapsed_s"], 1), "adapter_parameters": n_params,
               "init": state.get("init"), "teacher_rows": len(greedy) if cfg.data == "teacher" else None,
               "teacher_data": described,
               "base": base_signature(model), "torch": torch.__version__,
               "hardware": f"{engine.device}, {torch.get_num_threads()} thread(s)"}
    adapter.eval().requires_grad_(False).detach()
    adapter.config.training = summary
    adapter.save(out_dir)
    write_card(out_dir, summary)
    if own_work:
        shutil.rmtree(work, ignore_errors=True)
    engine.extras["lud"] = adapter
    log(f"saved LUD parameters to {out_dir}")
    return summary


def init_from(adapter: LUDAdapter, folder: Path, model) -> dict:
    """Load the parameters in `folder` into `adapter` (a longer run on top of an earlier one; same k, rank and
    targets); returns what they had been trained with, for the card."""
    src = LUDAdapter.load(folder, model)
    a, b = src.config, adapter.config
    if (a.k, a.rank, list(a.targets)) != (b.k, b.rank, list(b.targets)):
        raise SystemExit(f"--init {folder}: k {a.k}, rank {a.rank}, targets {','.join(a.targets)}; this run: k {b.k}, "
                         f"rank {b.rank}, targets {','.join(b.targets)}: give the same --k, --rank and --targets")
    adapter.load_state_dict(src.state_dict())
    t = getattr(a, "training", None) or {}
    before = t.get("init") or {}
    at9 = [f for f in t.get("heldout") or [] if f.get("kind") == "all" and f.get("threshold") == 0.9
           and f.get("k") == a.k]
    return {"folder": str(folder), "steps": (t.get("steps_done") or 0) + (before.get("steps") or 0), "alpha": a.alpha,
            "train_minutes": round(((t.get("train_time_s") or 0) / 60) + (before.get("train_minutes") or 0), 1),
            "lr": (t.get("config") or {}).get("lr"), "hardware": t.get("hardware"),
            "heldout_09": ({"tokens_per_pass": at9[0]["tokens_per_pass"], "wrong_steps": at9[0]["wrong_steps"]}
                           if at9 else None)}


def write_card(out_dir, summary: dict, sweep_md: str | None = None) -> Path:
    """README.md for a LUD parameter folder, written from the run's own figures."""
    out_dir = Path(out_dir)
    cfg, hist = summary["config"], summary.get("history") or []
    first, last = (hist[0], hist[-1]) if hist else ({}, {})
    lines = [
        f"# LUD parameters for {summary['base'].get('name') or 'the model'}", "",
        "Lexical Unit Decoding (Sun et al., LREC-COLING 2024, arXiv 2405.15208): a LoRA adapter gated to k-1",
        "padding slots after the last real token, plus a learned pad embedding. Real tokens keep the base",
        "model's weights exactly; the pad slots predict the following tokens, accepted while their",
        "confidence exceeds the strategy's threshold (strategy `lud`, lossy).", "",
        "- made by: `python -m paradec train lud --model <model>` (paradec/training/lud_train.py)",
        f"- k = {cfg['k']} (1 real + {cfg['k'] - 1} pad slots), lexical-unit confidence alpha = {cfg['alpha']}",
        f"- LoRA rank {cfg['rank']}, scale {cfg['scale']}, on attention q/k/v/o and MLP projections of every layer; "
        f"{summary.get('adapter_parameters', 0) / 1e6:.2f}M trainable parameters",
        (f"- data: the base model's own answers (paradec.training.teacher: {summary['teacher_data']}"
         f"{'; ' + str(summary['teacher_rows']) + ' answers' if summary.get('teacher_rows') else ''}), prompt + "
         f"answer windows of up to {cfg['window']} tokens, {cfg['cuts']} cut points per window inside the answer"
         if cfg.get("data") == "teacher" and summary.get("teacher_data") else
         f"- data: the base model's own answers to the training prompt set (paradec.training.teacher: "
         f"{cfg.get('prompts', 288)} chat prompts asked for"
         f"{' (' + str(summary['teacher_rows']) + ' answers kept)' if summary.get('teacher_rows') else ''}, from the "
         f"standard library, disjoint from evals/suites, one sampled and one greedy answer each), "
         f"prompt + answer windows of up to {cfg['window']} tokens, {cfg['cuts']} cut points per window inside "
         f"the answer" if cfg.get("data") == "teacher" else
         f"- data: windows of {cfg['window']} tokens from the standard-library corpus (raw text and chat examples) "
         f"and {cfg['greedy']} greedy answers of the base model; {cfg['cuts']} cut points per window"),
        "- lexical-unit rule: pad slot j after cut i is labelled x_{i+j} when c_i..c_{i+j} (the base's "
        "teacher-forced probabilities of those tokens) all exceed alpha, STOP at the first slot where that fails",
        f"- training: {summary['steps_done']} steps x {cfg['batch']} windows, lr {cfg['lr']}, "
        f"{summary['train_time_s'] / 60:.1f} min on {summary.get('hardware', 'CPU')}",
    ]
    ini = summary.get("init")
    if ini:
        h9 = ini.get("heldout_09") or {}
        lines.append(f"- started from the parameters then in {ini['folder']} ({ini['steps']} steps"
                     f"{', alpha ' + str(ini['alpha']) if ini.get('alpha') not in (None, cfg['alpha']) else ''}, "
                     f"{ini['train_minutes']} min, lr {ini.get('lr')}, {ini.get('hardware')}; held-out k={cfg['k']} "
                     f"threshold 0.9 then {h9.get('tokens_per_pass', float('nan')):.2f} tokens/pass, "
                     f"{100 * h9.get('wrong_steps', float('nan')):.1f}% wrong steps): the steps above come on top")
    if hist:
        lines.append(f"- pad-slot loss {first['loss']:.3f} (first {hist[0]['step']} steps) -> {last['loss']:.3f} "
                     f"(last logged), pad-slot label accuracy {first['acc']:.2f} -> {last['acc']:.2f}")
    lines += ["", "Files: `adapter.safetensors` (LoRA A/B per module, `pad_embedding`, STOP head), "
              "`lud_config.json`.", ""]
    if summary.get("heldout"):
        figs = summary["heldout"]
        lines += ["## Held-out figures (teacher-forced, greedy)", "",
                  f"On the base model's greedy answers to {summary.get('heldout_rows')} held-out prompts (modules no "
                  "training prompt used), every answer position: the step greedy `lud` would take there. Tokens per "
                  "pass = 1 + accepted pad tokens; a wrong step accepted a token that is not the base's greedy "
                  "choice (after one, lud's text leaves ar's).", "", figures_markdown(figs), ""]
        kinds = sorted({f["kind"] for f in figs} - {"all"})
        th = 0.9 if any(f["threshold"] == 0.9 for f in figs) else figs[0]["threshold"]
        lines += [f"By prompt kind, k={cfg['k']}, threshold {th}:", "", "| kind | tokens/pass | wrong steps | cuts |",
                  "|---|---|---|---|"]
        for kd in kinds:
            f = next(f for f in figs if f["kind"] == kd and f["k"] == cfg["k"] and f["threshold"] == th)
            lines.append(f"| {kd} | {f['tokens_per_pass']:.2f} | {100 * f['wrong_steps']:.1f}% | {f['cuts']} |")
        lines.append("")
    if summary.get("curve"):
        lines += ["## Held-out curve (first rows only, threshold 0.9)", "", "| step | " +
                  " | ".join(f"k={f['k']}" for f in summary["curve"][0]["figures"] if f["threshold"] == 0.9) + " |",
                  "|---|" + "---|" * sum(1 for f in summary["curve"][0]["figures"] if f["threshold"] == 0.9)]
        for c in summary["curve"]:
            lines.append(f"| {c['step']} | " + " | ".join(
                f"{f['tokens_per_pass']:.2f} tok/pass, {100 * f['wrong_steps']:.1f}% wrong"
                for f in c["figures"] if f["threshold"] == 0.9) + " |")
        lines.append("")
    if sweep_md:
        lines += ["## Threshold sweep", "", sweep_md.strip(), ""]
    path = out_dir / "README.md"
    path.write_text("\n".join(lines))
    return path


# ---------------------------------------------------------------- command

def build_parser() -> argparse.ArgumentParser:
    d = LUDTrainConfig()
    p = argparse.ArgumentParser(prog="python -m paradec train lud",
                                description="train Lexical Unit Decoding parameters (gated LoRA + pad embedding)")
    p.add_argument("--model", help="local model folder, hub id, or paradec-tiny (default: Qwen2.5-Coder-0.5B-Instruct)")
    p.add_argument("--k", type=int, default=d.k, help="tokens per pass: 1 real + k-1 pad slots")
    p.add_argument("--alpha", type=float, default=d.alpha, help="lexical-unit confidence threshold for the data")
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--rank", type=int, default=d.rank)
    p.add_argument("--targets", default=d.targets, help="comma-separated names of the linears that get LoRA")
    p.add_argument("--batch", type=int, default=d.batch, help="windows per step")
    p.add_argument("--window", type=int, default=d.window, help="tokens per window")
    p.add_argument("--cuts", type=int, default=d.cuts, help="cut points per window")
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--greedy", type=int, default=d.greedy, help="greedy base-model answers added to the data "
                                                                 "(--data corpus)")
    p.add_argument("--data", choices=("teacher", "corpus"), default="teacher",
                   help="teacher: the target's own answers to the training prompt set (cached, shared with train "
                        "ptp/draft); corpus: standard-library text plus --greedy answers")
    p.add_argument("--eval-every", type=int, default=d.eval_every,
                   help="held-out acceptance figures every n steps (teacher data; 0 = at the end only)")
    p.add_argument("--eval-rows", type=int, default=d.eval_rows, help="held-out answers for those figures")
    p.add_argument("--prompts", type=int, default=d.prompts, help="training prompts for teacher answers (--data teacher)")
    from . import teacher as TCH
    TCH.add_cache_args(p)
    p.add_argument("--init", default="", help="start from the LUD parameters in this folder (same --k, --rank and "
                                              "--targets) instead of from scratch")
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps (default: a tenth of --steps, at most 20)")
    checkpoint.add_run_args(p, "lud", d.ckpt_every, d.seed)
    return p


def train_lud_main(argv: list[str]) -> int:
    """`python -m paradec train lud ...` -> exit status."""
    args = build_parser().parse_args(argv)
    if args.k < 2:
        print("error: --k must be at least 2 (one real token plus at least one pad slot)", file=sys.stderr)
        return 2
    if not 0.0 < args.alpha < 1.0:
        print("error: --alpha must be between 0 and 1", file=sys.stderr)
        return 2
    if args.init and not Path(args.init).is_dir():
        print(f"error: --init {args.init}: no such folder", file=sys.stderr)
        return 2
    engine, out = checkpoint.engine_and_out(args, LUDAdapter)
    if engine is None:
        print(f"error: {out}", file=sys.stderr)
        return 2
    cfg = LUDTrainConfig(k=args.k, alpha=args.alpha, steps=args.steps, rank=args.rank, batch=args.batch,
                         window=args.window, cuts=args.cuts, targets=args.targets, lr=args.lr, greedy=args.greedy,
                         seed=args.seed, data=args.data, eval_every=args.eval_every, eval_rows=args.eval_rows,
                         ckpt_every=args.ckpt_every, max_docs=args.max_docs, prompts=args.prompts, init=args.init,
                         sampled_prompts=args.sampled_prompts, teacher_cache=args.teacher_cache or "",
                         warmup=args.warmup if args.warmup is not None else min(20, max(1, args.steps // 10)))
    summary = train_lud(engine, cfg, out, args.work, log=lambda m: print(m, file=sys.stderr),
                        progress=not args.no_progress)
    print(json.dumps({"out": str(out), "steps": summary["steps_done"], "train_time_s": summary["train_time_s"],
                      "final": summary["history"][-1] if summary["history"] else None}))
    return 0


# ---------------------------------------------------------------- threshold sweep

def sweep_markdown(rows: list[dict], head: str = "") -> str:
    def f(v, fmt):
        return "–" if v is None else format(v, fmt)

    def pair(r, key):
        a, b = r.get(key + "_ar"), r.get(key + "_lud")
        return "–" if a is None and b is None else f"{f(a and 100 * a, '.0f')}% / {f(b and 100 * b, '.0f')}%"
    out = [head.strip(), ""] if head else []
    out += ["| suite | k | threshold | speed-up vs ar | ar tokens/s | lud tokens/s | tokens/pass | ROUGE-L vs ar "
            "| ROUGE-L vs ref ar / lud | perplexity ar | perplexity lud | perplexity change | code parses ar / lud "
            "| passes checks ar / lud | n |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ch = None if not (r["ppl_ar"] and r["ppl_lud"]) else 100 * (r["ppl_lud"] / r["ppl_ar"] - 1)
        ref = "–" if r.get("ref_ar") is None else f"{r['ref_ar']:.3f} / {f(r.get('ref_lud'), '.3f')}"
        out.append(f"| {r['suite']} | {r.get('k') or '–'} | {r['threshold']} | {f(r['speedup'], '.2f')}× | "
                   f"{f(r['tps_ar'], '.1f')} | {f(r['tps_lud'], '.1f')} | {f(r['tau'], '.2f')} | {f(r['rouge'], '.3f')} | "
                   f"{ref} | {f(r['ppl_ar'], '.2f')} | {f(r['ppl_lud'], '.2f')} | {f(ch, '+.1f')}% | "
                   f"{pair(r, 'parses')} | {pair(r, 'passes')} | {r['n']} |")
    return "\n".join(out) + "\n"


def sweep_head(rows: list[dict], db=None) -> str:
    """The sweep table's first line: when its runs were taken, on which machine (this one: the sweep's bench runs
    are its subprocesses) and in which device and dtype (as stored with the runs)."""
    from ..engine import cpu_name
    from ..store import Store, _normalise_url
    url = _normalise_url(db)
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).exists():
        return ""                                   # no such database (nothing to read, nothing to create)
    store = Store(url)
    try:
        runs = [store.get_run(int(r["run"])) for r in rows if r.get("run") is not None]
    finally:
        store.close()
    runs = [r for r in runs if r]
    if not runs:
        return ""
    kinds = sorted({f"{r['device']}, {r['dtype']}" for r in runs})
    first, last = (min(r["created_at"] for r in runs), max(r["created_at"] for r in runs))
    return (f"Runs {runs[0]['id']}-{runs[-1]['id']}, {first:%Y-%m-%d %H:%M}-{last:%H:%M} UTC, {cpu_name()}, "
            f"{'; '.join(kinds)}, model {runs[0]['model']}:")


def sweep_main(argv: list[str]) -> int:
    """`python -m paradec.training.lud_train sweep`: one `paradec bench` run (ar + lud) per suite and threshold,
    stored in the app's database unless --db says otherwise (each lud result keeps its threshold, so the
    Dashboard's parameter-sweep chart plots them); prints / writes a Markdown table. Speed-ups are within each
    run (same prompts, same process)."""
    import os
    import subprocess
    p = argparse.ArgumentParser(prog="python -m paradec.training.lud_train sweep")
    p.add_argument("--model")
    p.add_argument("--thresholds", default="0.5,0.7,0.8,0.9,0.95")
    p.add_argument("--suites", default="code,qa")
    p.add_argument("--limit", type=int, default=10)
    p.add_argument("--k", default="", help="comma-separated k values to sweep (default: the strategy's)")
    p.add_argument("--configs", default="", help="K:THRESHOLD pairs instead of every k x threshold, e.g. "
                                                 "2:0.9,5:0.9,5:0.95")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--adapter", help="LUD folder (default <model>/lud)")
    p.add_argument("--db", help="SQLAlchemy URL or SQLite file for the runs (default: the app's, $PARADEC_DB or "
                                "data/paradec.db, so the Dashboard charts the sweep)")
    p.add_argument("--out", help="write the Markdown table here")
    p.add_argument("--json-out", help="write the rows as JSON here")
    args = p.parse_args(argv)
    rows = []
    ks = [int(k) for k in str(args.k).split(",") if k.strip()] or [None]
    configs = [(int(c.split(":")[0]), float(c.split(":")[1])) for c in args.configs.split(",") if c.strip()] or \
        [(k, float(t)) for k in ks for t in args.thresholds.split(",")]
    for suite in args.suites.split(","):
        for k, th in configs:
            params = {"threshold": th}
            if k:
                params["k"] = k
            if args.adapter:
                params["adapter"] = args.adapter
            cmd = [sys.executable, "-m", "paradec", "bench", "--suite", suite, "--strategies", "ar,lud",
                   "--params", json.dumps({"lud": params}), "--limit", str(args.limit), "--json", "--no-roofline",
                   "--max-new-tokens", str(args.max_new_tokens),
                   "--name", f"lud-sweep {suite} k={k or 'default'} {th}"]
            if args.db:
                cmd += ["--db", args.db]
            if args.model:
                cmd += ["--model", args.model]
            r = subprocess.run(cmd, capture_output=True, text=True, env=os.environ)
            if r.returncode != 0:
                print(r.stderr[-2000:], file=sys.stderr)
                return r.returncode
            res = json.loads(r.stdout.strip().splitlines()[-1])
            by = {row["strategy"]: row for row in res["table"] if row["category"] == "all"}
            ar, lud = by["ar"], by["lud"]
            rows.append({"suite": suite, "k": k, "threshold": th, "run": res["run"], "speedup": lud["speedup"],
                         "tps_ar": ar["tokens_per_s"], "tps_lud": lud["tokens_per_s"], "tau": lud["tokens_per_pass"],
                         "rouge": lud["rouge_l_vs_ar"], "ref_ar": ar.get("rouge_l_vs_ref"),
                         "ref_lud": lud.get("rouge_l_vs_ref"), "ppl_ar": ar["perplexity"], "ppl_lud": lud["perplexity"],
                         "parses_ar": ar.get("code_parses"), "parses_lud": lud.get("code_parses"),
                         "passes_ar": ar.get("passes_tests"), "passes_lud": lud.get("passes_tests"),
                         "n": lud["n"]})
            print(json.dumps(rows[-1]), file=sys.stderr)
    md = sweep_markdown(rows, sweep_head(rows, args.db))
    print(md)
    from ..store import default_url
    print(f"runs {', '.join(str(r['run']) for r in rows)} stored in {args.db or default_url()}: the Dashboard's "
          "'Parameter sweep' chart shows them (lud · threshold)", file=sys.stderr)
    if args.out:
        Path(args.out).write_text(md)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["sweep"]:
        raise SystemExit(sweep_main(sys.argv[2:]))
    raise SystemExit(train_lud_main(sys.argv[1:]))
