"""`python -m paradec train focus`: train FocusLLM's candidate projections for a frozen base model.

Data: long token streams from the corpus (the raw text of the standard library and its documentation,
documents joined with EOS; modules split train / held-out as for the default model). A training step
takes one *memory* - n consecutive chunks of c tokens (n and c drawn per step so that positions and
chunk counts up to those of long prompts are seen; n*c <= --memory) - encodes it as one batch without a
graph, and asks Q queries of it at once. Each query is a local context of L tokens followed by m target
tokens; the loss is the cross-entropy of the m targets given the local context and the n candidates
(the candidates are made from the last `dynamic` tokens of the local context, and kept for all m
targets: the `refresh` = 0 regime the strategy runs by default). Two kinds of query, alternating:

* continuation: the local context is the text that follows the memory (or follows it further on), the
  targets the tokens after it - ordinary language modelling with the memory as far context;
* repetition: the local context ends with r tokens copied from somewhere in one chunk (preceded by text
  from elsewhere), the targets are the m tokens that follow the copied span in that chunk - the model
  can only get them from the candidates, so this teaches the candidates to find their chunk's part that
  matches the dynamic prompt and carry what comes next (a pass key after "The pass key is", say).

With --needle p, a share p of the steps are *retrieval* steps instead (paradec/training/needles.py): facts
hidden in the memory (a code, codes with owners, a key/value listing) and chat-formatted questions naming
them; the targets are the value and the turn's end, after the chat template's assistant opening. Their
dynamic prompt is the question without the template's closing, as the strategy builds it (F.dynamic_prompt).

Only the deltas train (rank --rank, 32 by default, or full rank as in the paper with 0; zero at the start);
the base model is frozen (in --dtype: bfloat16 where the CPU does bf16 matrix work, see `--dtype auto`). Checkpoints every
--ckpt-every steps (atomic), resumable; the parameters are written beside the model (`<model>/focus/`)
at every checkpoint (through the shared adapter files, paradec/adapters.py), with the held-out figures in
focus_config.json and a card (README.md).
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
import torch.nn.functional as Fn

from .. import focus as F
from . import checkpoint


@dataclass
class FocusTrainConfig:
    steps: int = 1000
    dynamic: int = 16
    queries: int = 6              # queries per memory (per step)
    local: int = 40               # most local-context tokens (at least `dynamic`)
    targets: int = 8              # target tokens per query
    memory: int = 2048            # most memory tokens per step
    max_chunks: int = 16
    chunk_sizes: str = "64,128,256,496"
    repetition: float = 0.5       # share of repetition queries
    copy_min: int = 2
    copy_max: int = 12
    lr: float = 2e-4
    warmup: int = 30
    seed: int = 0
    ckpt_every: int = 25
    eval_batches: int = 12
    max_docs: int = 0             # 0 = the whole corpus
    candidate_loss: float = 0.0   # weight of the auxiliary loss on the source chunk's candidate (0 = off)
    rank: int = 32                # rank of each delta (0 = full rank, the paper's; 176 MB on a 0.5B model)
    sink: bool = True             # open every local context with the model's chat head (F.sink_kv, F.chat_frame)
    needle: float = 0.0           # share of retrieval steps (paradec/training/needles.py)
    init: str = ""                # start from these parameters (a folder with adapter.safetensors of the same shape)


def token_streams(engine, max_docs: int = 0, seed: int = 0) -> dict[str, list[int]]:
    """{'train': ids, 'val': ids}: the corpus' raw documents, shuffled, EOS between documents."""
    from . import corpus as C
    corp = C.build_corpus()
    tok = engine.tokenizer
    eos = next(iter(engine.eos_ids), tok.eos_token_id)
    out = {}
    for split, docs in (("train", list(corp.train_raw)), ("val", list(corp.val_raw))):
        random.Random(seed).shuffle(docs)
        if max_docs:
            docs = docs[:max_docs]
        ids: list[int] = []
        for t in docs:
            ids += tok(t, add_special_tokens=False)["input_ids"] + [eos]
        out[split] = ids
    return out


def sample_batch(stream: list[int], cfg: FocusTrainConfig, rng: random.Random, kind: str | None = None) -> dict:
    """One memory (n chunks of c tokens) and `queries` queries of it (see the module doc)."""
    sizes = [int(s) for s in cfg.chunk_sizes.split(",")]
    c = rng.choice(sizes)
    n = rng.randint(1, max(1, min(cfg.max_chunks, cfg.memory // c)))
    L, m = rng.randint(cfg.dynamic, max(cfg.dynamic, cfg.local)), cfg.targets
    span = n * c
    need = span + 4 * (L + m)
    s = rng.randrange(0, len(stream) - need - 1)
    chunks = [stream[s + i * c: s + (i + 1) * c] for i in range(n)]
    after = s + span
    local, target, kinds, src = [], [], [], []
    for q in range(cfg.queries):
        k = kind or ("rep" if rng.random() < cfg.repetition else "cont")
        if k == "rep" and c > m + cfg.copy_min:
            i = rng.randrange(n)
            r = rng.randint(cfg.copy_min, min(cfg.copy_max, L, c - m))
            j = rng.randint(r, c - m)
            other = rng.randrange(0, len(stream) - L)
            local.append(stream[other: other + L - r] + chunks[i][j - r:j])
            target.append(chunks[i][j:j + m])
            src.append(i)
        else:
            k = "cont"
            o = after + rng.randint(0, 3 * (L + m)) if q else after
            local.append(stream[o:o + L])
            target.append(stream[o + L:o + L + m])
            src.append(-1)
        kinds.append(k)
    local, target = torch.tensor(local), torch.tensor(target)
    return {"chunks": torch.tensor(chunks), "local": local, "target": target, "kinds": kinds, "src": src, "c": c,
            "n": n, "inputs": torch.cat([local, target[:, :-1]], 1), "dyn": local[:, -cfg.dynamic:],
            "at": (L - 1 + torch.arange(m)).expand(len(local), -1)}


def needle_batch(stream: list[int], cfg: FocusTrainConfig, rng: random.Random, frame: dict) -> dict:
    """One retrieval memory and `queries` questions of it (paradec/training/needles.py), in the batch layout of
    `sample_batch`: rows of different lengths are padded on the right (inputs with the end token, targets with
    -100), `at` holds the positions whose logits predict each target, and every row's dynamic prompt is cut to
    the shortest one's length (one candidate pass runs them all)."""
    from .needles import needle_memory
    tok, tail, end = frame["tok"], frame["tail"], frame["end"]
    sizes = [int(x) for x in cfg.chunk_sizes.split(",")]
    c = rng.choice(sizes)
    n = rng.randint(1, max(1, min(cfg.max_chunks, cfg.memory // c)))
    kind, chunks, qa = needle_memory(tok, stream, n, c, cfg.queries, rng)
    rows, dyns = [], []
    for q, a, _ in qa:
        local = tok("\n\n" + q, add_special_tokens=False)["input_ids"] + list(tail)
        target = tok(a, add_special_tokens=False)["input_ids"] + [end]
        rows.append((local, target))
        dyns.append(F.dynamic_prompt(local, cfg.dynamic, list(tail)))
    d = min(len(x) for x in dyns)
    T = max(len(lo) + len(tg) - 1 for lo, tg in rows)
    m = max(len(tg) for _, tg in rows)
    inputs = torch.full((len(rows), T), end, dtype=torch.long)
    target = torch.full((len(rows), m), -100, dtype=torch.long)
    at = torch.zeros((len(rows), m), dtype=torch.long)
    for r, (lo, tg) in enumerate(rows):
        seq = lo + tg[:-1]
        inputs[r, :len(seq)] = torch.tensor(seq)
        target[r, :len(tg)] = torch.tensor(tg)
        at[r, :len(tg)] = len(lo) - 1 + torch.arange(len(tg))
    return {"chunks": torch.tensor(chunks), "inputs": inputs, "target": target, "at": at,
            "dyn": torch.tensor([x[-d:] for x in dyns]), "kinds": ["needle"] * len(rows), "needle_kind": kind,
            "src": [i for _, _, i in qa], "c": c, "n": n}


def draw_batch(stream: list[int], cfg: FocusTrainConfig, rng: random.Random, frame: dict | None,
               kind: str | None = None) -> dict:
    """A training or held-out batch: retrieval (`kind` 'needle', or drawn with probability cfg.needle), else
    `sample_batch`'s repetition / continuation queries."""
    if frame is not None and (kind == "needle" or (kind is None and cfg.needle > 0 and rng.random() < cfg.needle)):
        return needle_batch(stream, cfg, rng, frame)
    return sample_batch(stream, cfg, rng, kind)


def qa_frame(engine) -> dict:
    """What `needle_batch` needs of the model: its tokenizer, its chat template's closing (user turn end and
    assistant opening) and the token that ends the assistant's turn."""
    tail = F.chat_frame(engine)[1]
    end = tail[0] if tail else next(iter(engine.eos_ids), engine.tokenizer.eos_token_id)
    return {"tok": engine.tokenizer, "tail": tail, "end": end}


def batch_logits(engine, adapter, batch: dict, memory: bool = True, candidate_logits: bool = False, sink=None):
    """Logits (Q, m, V) of the targets given the local context and, with `memory`, the candidates. With
    `candidate_logits`, returns (those, the candidates' own next-token logits (Q, n, V)). `sink`: (token ids,
    their per-layer keys/values from `F.sink_kv`) that open the local context, before the candidates (and before
    the local context alone when there is no memory)."""
    model = engine.model
    dev = engine.device
    chunks, inputs, at = batch["chunks"].to(dev), batch["inputs"].to(dev), batch["at"].to(dev)
    Q = inputs.shape[0]
    n = chunks.shape[0] if memory else 0
    s, skv = (len(sink[0]), sink[1]) if sink and sink[0] else (0, None)
    if memory:
        with torch.no_grad():
            ccache = engine.new_cache()
            model(input_ids=chunks, past_key_values=ccache, use_cache=True, logits_to_keep=1)
            ccache = engine.repeat_cache(ccache, Q)
        dyn = batch["dyn"].to(dev).repeat_interleave(n, 0)
        nxt = torch.full((Q * n,), chunks.shape[1], device=dev)
        kv = F.candidate_pass(engine, adapter, ccache, None, nxt, dyn, groups=Q, want_logits=candidate_logits,
                              offset=s)
        if candidate_logits:
            kv, cand = kv
            cand = cand.view(Q, n, -1)
        cache = F.local_cache(engine, kv, skv)
    elif skv:
        cache = engine.cache_from_kv([(k.expand(Q, -1, -1, -1), v.expand(Q, -1, -1, -1)) for k, v in skv])
    else:
        cache = engine.new_cache()
    pos = torch.arange(s + n, s + n + inputs.shape[1], device=dev).expand(Q, -1)
    hidden = F._decoder(model)(input_ids=inputs, past_key_values=cache, position_ids=pos,
                               use_cache=True).last_hidden_state
    # the head only where a target is predicted (151,936 entries a row on the default model)
    logits = model.lm_head(hidden[torch.arange(Q, device=dev)[:, None], at]).float()
    return (logits, cand) if candidate_logits and memory else logits


def batch_loss(engine, adapter, batch: dict, memory: bool = True, candidate_loss: float = 0.0, sink=None
               ) -> tuple[torch.Tensor, dict]:
    """Mean cross-entropy of the targets; plus, with `candidate_loss` > 0, that weight times the cross-entropy
    of each repetition query's first target under its SOURCE chunk's candidate (the candidate's own
    next-token prediction, through the frozen head): a direct signal for the candidate to find the part of
    its chunk that matches the dynamic prompt. The candidates of other chunks get no such target."""
    aux = candidate_loss > 0 and memory and any(i >= 0 for i in batch["src"])
    logits = batch_logits(engine, adapter, batch, memory, candidate_logits=aux, sink=sink)
    if aux:
        logits, cand = logits
    target = batch["target"].to(engine.device)
    valid = target != -100                       # retrieval answers are padded on the right
    per = Fn.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="none").view(target.shape)
    extra = None
    if aux:
        rows = [q for q, i in enumerate(batch["src"]) if i >= 0]
        sel = cand[torch.tensor(rows), torch.tensor([batch["src"][q] for q in rows])]
        extra = Fn.cross_entropy(sel, target[torch.tensor(rows, device=target.device), 0])
    with torch.no_grad():
        hit = (logits.argmax(-1) == target) & valid
        stats = {}
        for k in KINDS:
            sel = torch.tensor([x == k for x in batch["kinds"]], device=per.device)
            if sel.any():
                cnt = valid[sel].sum()
                stats[k] = {"loss": float(per[sel].sum() / cnt), "acc": float(hit[sel].sum() / cnt), "n": int(cnt),
                            "rows": int(sel.sum()), "exact": int((hit[sel] == valid[sel]).all(-1).sum()),
                            "first": int(hit[sel][:, 0].sum())}
        if extra is not None:
            stats["candidate_loss"] = float(extra)
    mean = per.sum() / valid.sum()
    loss = mean if extra is None else mean + candidate_loss * extra
    return loss, stats


KINDS = ("rep", "cont", "needle")


@torch.no_grad()
def evaluate(engine, adapter, stream: list[int], cfg: FocusTrainConfig, batches: int, seed: int = 1234,
             sink=None, frame: dict | None = None) -> dict:
    """Held-out loss and top-1 accuracy of the targets, with the candidates and without any memory (the
    base model on the local context alone, after the same sink), per query kind; with retrieval on
    (cfg.needle > 0 and a `frame`), every third batch is retrieval and `needle_*_exact` is the share of its
    questions whose whole answer is the top-1 token at every position (teacher-forced)."""
    rng = random.Random(seed)
    kinds = ["rep", "cont"] + (["needle"] if cfg.needle > 0 and frame is not None else [])
    acc = {(k, mem): [0.0, 0.0, 0, 0, 0, 0] for k in KINDS for mem in (True, False)}
    for b in range(batches):
        batch = draw_batch(stream, cfg, rng, frame, kind=kinds[b % len(kinds)])
        for mem in (True, False):
            _, st = batch_loss(engine, adapter, batch, mem, sink=sink)
            for k, v in st.items():
                if not isinstance(v, dict):
                    continue
                a = acc[(k, mem)]
                a[0] += v["loss"] * v["n"]
                a[1] += v["acc"] * v["n"]
                a[2] += v["n"]
                a[3] += v["exact"]
                a[4] += v["rows"]
                a[5] += v["first"]
    out = {}
    for (k, mem), (ls, ac, n, ex, rows, first) in acc.items():
        if n:
            tag = f"{k}_{'focus' if mem else 'local_only'}"
            out[f"{tag}_loss"] = round(ls / n, 4)
            out[f"{tag}_acc"] = round(ac / n, 4)
            if k == "needle":
                out[f"{tag}_exact"] = round(ex / rows, 4)
                out[f"{tag}_first"] = round(first / rows, 4)
    return out


@torch.no_grad()
def in_window_reference(engine, stream: list[int], cfg: FocusTrainConfig, batches: int, seed: int = 1234,
                        sink_ids: list[int] | None = None, frame: dict | None = None) -> dict:
    """The repetition (and retrieval) queries of `evaluate` (same seed, same batches) answered by the frozen base
    model with the query's source chunk in its own window followed by the local context: full attention to the one
    chunk that holds the answer - what the candidates would carry if they were perfect, for this base model.
    Retrieval adds `needle_in_window_exact` (whole answers right, teacher-forced) and `_first` (first tokens)."""
    rng = random.Random(seed)
    kinds = ["rep", "cont"] + (["needle"] if cfg.needle > 0 and frame is not None else [])
    acc = {k: [0.0, 0, 0, 0, 0, 0] for k in ("rep", "needle")}      # loss, hits, tokens, exact, first, rows
    for b in range(batches):
        batch = draw_batch(stream, cfg, rng, frame, kind=kinds[b % len(kinds)])
        for q, i in enumerate(batch["src"]):
            kind = batch["kinds"][q]
            if i < 0 or kind not in acc:
                continue
            tg = batch["target"][q]
            tg = tg[tg != -100].to(engine.device)
            last = int(batch["at"][q, len(tg) - 1])
            inp = torch.cat([torch.tensor(sink_ids or [], dtype=torch.long), batch["chunks"][i],
                             batch["inputs"][q, :last + 1]]).to(engine.device)
            lg = engine.model(input_ids=inp[None], logits_to_keep=len(tg)).logits[0].float()
            hit = lg.argmax(-1) == tg
            a = acc[kind]
            a[0] += float(Fn.cross_entropy(lg, tg, reduction="sum"))
            a[1] += int(hit.sum())
            a[2] += len(tg)
            a[3] += int(hit.all())
            a[4] += int(hit[0])
            a[5] += 1
    out = {"rep_in_window_loss": round(acc["rep"][0] / max(1, acc["rep"][2]), 4),
           "rep_in_window_acc": round(acc["rep"][1] / max(1, acc["rep"][2]), 4), "tokens": acc["rep"][2]}
    ls, h, n, ex, first, rows = acc["needle"]
    if rows:
        out.update({"needle_in_window_loss": round(ls / n, 4), "needle_in_window_acc": round(h / n, 4),
                    "needle_in_window_exact": round(ex / rows, 4), "needle_in_window_first": round(first / rows, 4),
                    "needle_rows": rows})
    return out


def init_from(adapter, folder) -> None:
    """Load the parameters saved in `folder` (adapter.safetensors) into `adapter`, which must have their shapes
    (same model, rank and projections); a clear error otherwise."""
    from safetensors.torch import load_file
    path = Path(folder) / F.WEIGHTS
    if not path.exists():
        raise ValueError(f"--init: no {F.WEIGHTS} in {folder}")
    state = load_file(str(path))
    own = adapter.state_dict()
    bad = sorted(set(own) ^ set(state)) + [k for k in own if k in state and own[k].shape != state[k].shape]
    if bad:
        raise ValueError(f"--init: the parameters in {folder} do not fit this model and rank (first mismatch: {bad[0]})")
    adapter.load_state_dict(state)


def _cpu(engine) -> str:
    from ..engine import cpu_name
    return cpu_name() if engine.device.type == "cpu" else torch.cuda.get_device_name(engine.device)


def train_focus(engine, cfg: FocusTrainConfig, out_dir, work_dir=None, log=print, progress: bool = True,
                streams: dict | None = None) -> dict:
    """Train (or resume) FocusLLM parameters for `engine`'s model; writes them to out_dir, returns a summary."""
    from tqdm import tqdm
    out_dir = Path(out_dir)
    own_work = work_dir is None
    work = Path(work_dir) if work_dir else out_dir / ".checkpoint"
    work.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    model = engine.model
    model.eval().requires_grad_(False)
    if max(int(s) for s in cfg.chunk_sizes.split(",")) + cfg.dynamic > engine.context_length:
        raise ValueError(f"a chunk size in {cfg.chunk_sizes} plus the {cfg.dynamic}-token dynamic prompt exceeds the "
                         f"model's context of {engine.context_length}")
    adapter = F.FocusAdapter.for_model(model, cfg.dynamic, all_layers=cfg.candidate_loss > 0, rank=cfg.rank)
    if cfg.init:
        init_from(adapter, cfg.init)
        log(f"started from the parameters in {cfg.init}")
    adapter.attach(model)
    opt = torch.optim.AdamW(adapter.parameters(), lr=cfg.lr, weight_decay=0.0)
    rng = random.Random(cfg.seed)
    state = {"step": 0, "elapsed_s": 0.0, "history": [], "eval": []}
    data_file = work / "focus_data.pt"
    if streams is None:
        if data_file.exists():
            streams = torch.load(data_file, weights_only=False)
        else:
            t0 = time.time()
            streams = token_streams(engine, cfg.max_docs, cfg.seed)
            torch.save(streams, data_file)
            log(f"corpus: train {len(streams['train']):,} tokens, held-out {len(streams['val']):,} tokens "
                f"({time.time() - t0:.0f}s)")
    ckpt = work / "focus_checkpoint.pt"
    saved = checkpoint.resume(ckpt, adapter, opt, log)
    if saved is not None:
        rng.setstate(saved["rng"])
        state = saved["state"]
    frame = qa_frame(engine) if cfg.needle > 0 else None
    sink_ids = F.chat_frame(engine)[0] if cfg.sink else []
    sink = (sink_ids, F.sink_kv(engine, sink_ids)) if sink_ids else None
    adapter.meta["sink"] = "chat-head" if sink else None
    n_params = sum(p.numel() for p in adapter.parameters())
    log(f"FocusLLM parameters: {n_params / 1e6:.2f}M, dynamic prompt {cfg.dynamic}, {cfg.steps} steps")
    if not state["eval"]:
        state["eval"].append({"step": 0, **evaluate(engine, adapter, streams["val"], cfg, cfg.eval_batches,
                                                    sink=sink, frame=frame)})
        log(f"held-out at step 0: {state['eval'][-1]}")
    bar = tqdm(total=cfg.steps, initial=state["step"], desc="train focus", file=sys.stderr, disable=not progress)
    t_last = time.time()
    recent: list[dict] = []
    while state["step"] < cfg.steps:
        for g in opt.param_groups:
            g["lr"] = checkpoint.cosine_lr(state["step"], cfg.lr, cfg.warmup, cfg.steps)
        loss, st = batch_loss(engine, adapter, draw_batch(streams["train"], cfg, rng, frame),
                              candidate_loss=cfg.candidate_loss, sink=sink)
        checkpoint.optimizer_step(loss, adapter.parameters(), opt)
        state["step"] += 1
        now = time.time()
        state["elapsed_s"] += now - t_last
        t_last = now
        recent.append({"loss": loss.item(), **{f"{k}_acc": v["acc"] for k, v in st.items() if isinstance(v, dict)},
                       **({"candidate_loss": st["candidate_loss"]} if "candidate_loss" in st else {})})
        bar.update(1)
        bar.set_postfix(loss=f"{recent[-1]['loss']:.3f}")
        if state["step"] % cfg.ckpt_every == 0 or state["step"] == cfg.steps:
            rec = {"step": state["step"], "loss": round(sum(r["loss"] for r in recent) / len(recent), 4),
                   "elapsed_s": round(state["elapsed_s"], 1)}
            for k in ("rep_acc", "cont_acc", "needle_acc", "candidate_loss"):
                v = [r[k] for r in recent if k in r]
                if v:
                    rec[k] = round(sum(v) / len(v), 4)
            state["history"].append(rec)
            log(f"step {state['step']}: {rec}")
            recent = []
            if state["step"] % (cfg.ckpt_every * 4) == 0 or state["step"] == cfg.steps:
                state["eval"].append({"step": state["step"],
                                      **evaluate(engine, adapter, streams["val"], cfg, cfg.eval_batches, sink=sink,
                                                 frame=frame)})
                log(f"held-out at step {state['step']}: {state['eval'][-1]}")
            checkpoint.save(ckpt, {"adapter": adapter.state_dict(), "opt": opt.state_dict(), "rng": rng.getstate(),
                                   "state": state, "config": asdict(cfg)})
            adapter.meta["training"] = {"config": asdict(cfg), "steps_done": state["step"],
                                        "train_time_s": round(state["elapsed_s"], 1),
                                        "history": state["history"], "eval": state["eval"]}
            adapter.save(out_dir)
            t_last = time.time()
    bar.close()
    summary = {"config": asdict(cfg), "steps_done": state["step"], "train_time_s": round(state["elapsed_s"], 1),
               "history": state["history"], "eval": state["eval"], "parameters": n_params,
               "in_window": in_window_reference(engine, streams["val"], cfg, cfg.eval_batches, sink_ids=sink_ids,
                                                frame=frame),
               "torch": torch.__version__, "dtype": str(engine.dtype).replace("torch.", ""),
               "hardware": f"{engine.device} ({_cpu(engine)}), {torch.get_num_threads()} thread(s)"}
    adapter.detach()
    adapter.meta["training"] = summary
    adapter.save(out_dir)
    write_card(out_dir, summary)
    if own_work:
        shutil.rmtree(work, ignore_errors=True)
    return summary


def write_card(out_dir, summary: dict, extra: str = "") -> Path:
    cfg, ev = summary["config"], summary["eval"]
    first, last = (ev[0], ev[-1]) if ev else ({}, {})
    lines = ["# FocusLLM parameters", "",
             "Candidate-token q/k/v/o deltas for the frozen base model in the folder above (paradec/focus.py; "
             "trained by `python -m paradec train focus`, paradec/training/focus_train.py).", "",
             f"- parameters: {summary['parameters']:,} (one "
             f"{'rank-' + str(cfg['rank']) if cfg.get('rank') else 'full-rank'} delta per attention projection that "
             "can reach the candidates' keys and values: the last layer's q and o are left out unless "
             "--candidate-loss is on)",
             f"- dynamic prompt: {cfg['dynamic']} tokens; chunk sizes {cfg['chunk_sizes']}; up to {cfg['max_chunks']} "
             f"chunks, {cfg['memory']} memory tokens per step; {cfg['queries']} queries per memory "
             f"({cfg['repetition']:.0%} repetition), {cfg['targets']} target tokens each"
             + (f"; {cfg['needle']:.0%} of the steps retrieval (paradec/training/needles.py)" if cfg.get("needle") else "")
             + (f"; started from {cfg['init']}" if cfg.get("init") else ""),
             f"- steps: {summary['steps_done']} in {summary['train_time_s'] / 60:.1f} min on {summary['hardware']} "
             f"(torch {summary['torch']}, base model in {summary.get('dtype', 'float32')}); lr {cfg['lr']}, warmup "
             f"{cfg['warmup']}, cosine to 10%", "",
             "## Held-out figures (modules the base model never trained on)", "",
             "Target tokens after a local context: loss (nats/token) and top-1 accuracy, with the candidates "
             "of the memory (focus) and with no memory at all (the frozen base on the local context alone).", "",
             ]
    label = {"rep": "repetition", "cont": "continuation", "needle": "retrieval"}
    cols = [(f"{k}_{w}_{x}", f"{label[k] + ': ' if w == 'focus' and x == 'loss' else ''}"
             f"{'focus' if w == 'focus' else 'local only'} {x}")
            for k in KINDS if any(f"{k}_focus_loss" in e for e in ev)
            for w, x in (("focus", "loss"), ("local_only", "loss"), ("focus", "acc"), ("local_only", "acc"),
                         ("focus", "exact"), ("local_only", "exact"), ("focus", "first"), ("local_only", "first"))
            if any(f"{k}_{w}_{x}" in e for e in ev)]
    lines += ["| step | " + " | ".join(c for _, c in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for e in ev:
        lines.append("| " + " | ".join(str(x) for x in [e["step"]] + [e.get(k, "") for k, _ in cols]) + " |")
    if any("needle_focus_loss" in e for e in ev):
        lines += ["", "Retrieval: facts hidden in the memory and asked for by a chat question (paradec/training/"
                  "needles.py); exact = share of questions whose whole answer is the top-1 token at every position "
                  "(teacher-forced), first = share whose first answer token is."]
        iw = summary.get("in_window") or {}
        if "needle_in_window_acc" in iw:
            lines += ["", f"Retrieval with the fact's source chunk in the frozen model's own window (the ceiling, "
                      f"{iw['needle_rows']} held-out questions): loss {iw['needle_in_window_loss']}, accuracy "
                      f"{iw['needle_in_window_acc']}, exact {iw['needle_in_window_exact']}, first "
                      f"{iw['needle_in_window_first']}."]
    iw = summary.get("in_window")
    if iw and ev:
        gain = ev[0].get("rep_local_only_loss", 0) - iw["rep_in_window_loss"]
        got = ev[0].get("rep_local_only_loss", 0) - last.get("rep_focus_loss", 0)
        lines += ["", f"Reference: the same held-out repetition queries answered by the frozen base model with the query's "
                  f"source chunk in its own window (full attention to the one chunk that holds the answer): loss "
                  f"{iw['rep_in_window_loss']}, accuracy {iw['rep_in_window_acc']} ({iw['tokens']} target tokens). "
                  f"At step {last.get('step')} the candidates recover {got / gain:.0%} of the loss gain that the whole "
                  "relevant chunk gives, while the local context sees every chunk of the memory only through one "
                  "candidate token per chunk." if gain > 0 else ""]
    if extra:
        lines += ["", extra.strip()]
    path = Path(out_dir) / "README.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def build_parser() -> argparse.ArgumentParser:
    d = FocusTrainConfig()
    p = argparse.ArgumentParser(prog="python -m paradec train focus",
                                description="train FocusLLM candidate projections for a frozen model")
    p.add_argument("--model", help="local model folder, hub id, or paradec-tiny (default: Qwen2.5-Coder-0.5B-Instruct)")
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--dynamic", type=int, default=d.dynamic, help="dynamic prompt length (tokens)")
    p.add_argument("--queries", type=int, default=d.queries, help="queries per memory (per step)")
    p.add_argument("--local", type=int, default=d.local, help="most local-context tokens per query")
    p.add_argument("--targets", type=int, default=d.targets, help="target tokens per query")
    p.add_argument("--memory", type=int, default=d.memory, help="most memory tokens per step")
    p.add_argument("--max-chunks", type=int, default=d.max_chunks)
    p.add_argument("--chunk-sizes", default=d.chunk_sizes, help="comma-separated chunk lengths to draw from")
    p.add_argument("--repetition", type=float, default=d.repetition, help="share of repetition queries")
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--candidate-loss", type=float, default=d.candidate_loss,
                   help="weight of the auxiliary loss on each repetition query's source-chunk candidate (0 = off)")
    p.add_argument("--rank", type=int, default=d.rank,
                   help="rank of each delta (0 = full rank, as in the paper: 176 MB for the default model)")
    p.add_argument("--needle", type=float, default=d.needle,
                   help="share of retrieval steps: facts hidden in the memory, asked for by chat questions "
                        "(paradec/training/needles.py)")
    p.add_argument("--init", default=d.init, help="start from the parameters in this folder (same model and rank)")
    p.add_argument("--no-sink", action="store_true",
                   help="do not open the local context with the model's chat head (the sink; see paradec/focus.py)")
    p.add_argument("--eval-batches", type=int, default=d.eval_batches)
    checkpoint.add_run_args(p, "focus", d.ckpt_every, d.seed)
    return p


def train_focus_main(argv: list[str]) -> int:
    """`python -m paradec train focus ...` -> exit status."""
    args = build_parser().parse_args(argv)
    for name, v, lo in (("--steps", args.steps, 1), ("--dynamic", args.dynamic, 1), ("--queries", args.queries, 1),
                        ("--targets", args.targets, 1), ("--max-chunks", args.max_chunks, 1), ("--rank", args.rank, 0)):
        if v < lo:
            print(f"error: {name} must be at least {lo}, got {v}", file=sys.stderr)
            return 2
    for name, v in (("--repetition", args.repetition), ("--needle", args.needle)):
        if not 0.0 <= v <= 1.0:
            print(f"error: {name} must be between 0 and 1, got {v}", file=sys.stderr)
            return 2
    try:
        sizes = [int(s) for s in args.chunk_sizes.split(",")]
        assert sizes and min(sizes) > args.targets + 2
    except (ValueError, AssertionError):
        print(f"error: --chunk-sizes must be comma-separated whole numbers above --targets + 2, got {args.chunk_sizes!r}",
              file=sys.stderr)
        return 2
    engine, out = checkpoint.engine_and_out(args, F.FocusAdapter)
    if engine is None:
        print(f"error: {out}", file=sys.stderr)
        return 2
    cfg = FocusTrainConfig(steps=args.steps, dynamic=args.dynamic, queries=args.queries,
                           local=max(args.local, args.dynamic), targets=args.targets, memory=args.memory,
                           max_chunks=args.max_chunks, chunk_sizes=args.chunk_sizes, repetition=args.repetition,
                           lr=args.lr, candidate_loss=args.candidate_loss, rank=args.rank, sink=not args.no_sink,
                           needle=args.needle, init=args.init or "", warmup=min(30, max(1, args.steps // 10)), seed=args.seed,
                           ckpt_every=args.ckpt_every, eval_batches=args.eval_batches, max_docs=args.max_docs)
    try:
        summary = train_focus(engine, cfg, out, args.work, log=lambda m: print(m, file=sys.stderr),
                              progress=not args.no_progress)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"out": str(out), "steps": summary["steps_done"], "train_time_s": summary["train_time_s"],
                      "eval": summary["eval"][-1] if summary["eval"] else None}))
    return 0
