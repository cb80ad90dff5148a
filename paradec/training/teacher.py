"""The target's own answers to the training prompt set: the distillation data every trainer shares.

`answers(engine, ...)` encodes the training prompts (paradec.training.prompts: chat requests made from the
standard library, disjoint from evals/suites) and the held-out ones, and has the target answer each twice:
once sampled at the PTP paper's settings (T 0.7, top-k 50, top-p 0.95) and once greedily (the Arena's
default), in left-padded batches (`sampled_prompts` K: the prompts after the first K are answered greedily
only, so a larger set costs half as much a prompt). The answers are cached under data/work/<model>-teacher/
(teacher.pt, teacher_heldout.pt; teacher_bfloat16.pt and teacher_heldout_bfloat16.pt for answers made in bf16,
whose greedy answers differ from float32's), per prompt and kind of answer, for one model, length and seed (a
larger prompt set answers only its new prompts; saved every 96 prompts, so a stopped run keeps its work), so the
draft distiller and the PTP trainer made for the same target read one set of answers: generating them costs about
40 minutes on 2 CPU cores for the default model in float32 (the 512 greedy-only answers past the first 288
prompts: 26 minutes on a Zen 1 EPYC), and a second trainer pays nothing.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import decoding
from ..sampling import SamplingParams
from .prompts import training_prompts

ROOT = Path(__file__).resolve().parents[2]
TEACHER_SP = SamplingParams(0.7, 50, 0.95)


def default_cache(engine) -> Path:
    return ROOT / "data" / "work" / f"{engine.name}-teacher"


def dtype_name(engine) -> str:
    """The dtype the target answers in ("float32", "bfloat16"): greedy answers differ between precisions, so a
    cache holds one."""
    return str(engine.dtype).replace("torch.", "")


def teacher_rows(engine, prompts: list[list[int]], max_new: int, seed: int, cache_file: Path, label: str,
                 batch: int = 16, sampled: bool = True, chunk: int = 96) -> list[dict]:
    """One sampled (T 0.7, top-k 50, top-p 0.95) and one greedy completion per prompt (`sampled` False: the
    greedy one only), cached in cache_file (saved every `chunk` prompts, so a stopped run keeps what it made).

    The cache grows: answers already there for the same model, length and seed are kept, and only the answers
    it lacks (per prompt and kind, sampled or greedy) are made (a larger --prompts, whose first prompts are the
    smaller set's, costs only the new ones). The new prompts' sampled answers draw from a generator seeded with
    the seed and the number of prompts answered that way before, so a cache built in steps is reproducible step
    for step."""
    from tqdm import tqdm
    key = {"model": engine.name, "max_new": max_new, "seed": seed, "dtype": dtype_name(engine)}
    have: dict[tuple, list[dict]] = {}
    done: set[tuple[tuple, bool]] = set()          # (prompt, greedy) answered (possibly with nothing)
    if cache_file.exists():
        saved = torch.load(cache_file)
        old = {"dtype": "float32", **(saved.get("key") or {})}     # caches from before the dtype entry: float32
        if all(old.get(k) == v for k, v in key.items()):
            for r in saved["rows"]:
                have.setdefault(tuple(r["prompt"]), []).append(r)
            for p in saved.get("empty", []):       # prompts answered with nothing (kept so they are not redone)
                have.setdefault(tuple(p), [])
            if "done" in saved:
                done = {(tuple(p), bool(g)) for p, g in saved["done"]}
            else:                                  # a cache from before per-kind records: both kinds made
                done = {(p, g) for p in have for g in (False, True)}
    modes = (False, True) if sampled else (True,)
    todo = {g: [p for p in prompts if (tuple(p), g) not in done] for g in modes}

    def save():
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_name(cache_file.name + ".tmp")
        torch.save({"key": key, "rows": [r for rs in have.values() for r in rs],
                    "empty": [list(p) for p, rs in have.items() if not rs],
                    "done": [[list(p), g] for p, g in sorted(done)]}, tmp)
        tmp.replace(cache_file)
    if any(todo.values()):
        with tqdm(total=sum(map(len, todo.values())), desc=f"teacher completions ({label})", file=sys.stderr,
                  mininterval=5) as bar:
            for greedy in modes:
                for c0 in range(0, len(todo[greedy]), chunk):      # saved after each chunk: a stop loses one
                    part = todo[greedy][c0:c0 + chunk]
                    before = sum(1 for _p, g in done if g == greedy)
                    s = seed + int(greedy) + (1000 * before if before else 0)
                    sp = SamplingParams() if greedy else TEACHER_SP
                    comps = decoding.generate(engine, part, max_new, sp, s, batch, bar)
                    for p, c in zip(part, comps):
                        have.setdefault(tuple(p), [])
                        done.add((tuple(p), greedy))
                        if c:
                            have[tuple(p)].append({"prompt": p, "completion": c, "greedy": greedy})
                    save()
    wanted = [r for p in prompts for r in have[tuple(p)] if r["greedy"] or sampled]
    return [r for r in wanted if not r["greedy"]] + [r for r in wanted if r["greedy"]]


def encode_prompts(engine, prompts: list[dict], max_prompt: int) -> tuple[list[list[int]], dict]:
    """Chat-encoded prompts (their last max_prompt tokens), shortest first: batched generation left-pads each
    batch to its longest prompt, so batching similar lengths avoids prefilling padding. Also {ids: kind}."""
    enc = [(engine.encode_messages(p["messages"])[-max_prompt:], p["kind"]) for p in prompts]
    kinds = {tuple(ids): kind for ids, kind in enc}
    return sorted((ids for ids, _k in enc), key=len), kinds


def time_text(train_minutes, teacher_minutes) -> str:
    """A card's time line: training minutes, and the teacher's (a number, or where cached answers came from)."""
    t = f"{teacher_minutes} min" if isinstance(teacher_minutes, (int, float)) else str(teacher_minutes)
    return f"{train_minutes} min training; teacher answers: {t}"


@dataclass
class Answers:
    rows: list[dict]            # {"prompt", "completion", "greedy", "kind"}
    held: list[dict]            # the same for the held-out prompts
    description: str            # for a card
    minutes: float              # time spent generating (0 when read from the cache)
    cached: bool                # both sets read from the cache

    def minutes_for_card(self):
        """The teacher time a card reports: minutes spent, or where the answers came from when cached."""
        return "read from the cache an earlier run made (paradec.training.teacher)" if self.cached else \
            round(self.minutes, 2)


def add_cache_args(p) -> None:
    """The teacher-answer options `train draft`, `train eagle` and `train lud` share."""
    p.add_argument("--sampled-prompts", type=int,
                   help="only the first N training prompts get a sampled answer besides the greedy one (default all)")
    p.add_argument("--teacher-cache", help="folder of the target's cached answers (default data/work/<model>-teacher)")


def answers(engine, n_prompts: int = 288, n_held: int = 36, seed: int = 0, max_prompt: int = 320,
            gen_tokens: int = 128, gen_batch: int = 48, cache: Path | None = None,
            sampled_prompts: int | None = None) -> Answers:
    """The target's sampled and greedy answers to n_prompts training and n_held held-out prompts; with
    `sampled_prompts` K, the training prompts after the first K get the greedy answer only (half the cost: more
    prompts for the same time)."""
    cache = Path(cache) if cache else default_cache(engine)
    tag = "" if dtype_name(engine) == "float32" else f"_{dtype_name(engine)}"     # one file per answering dtype
    files = (cache / f"teacher{tag}.pt", cache / f"teacher_heldout{tag}.pt")

    def stamps():
        return [f.stat().st_mtime_ns if f.exists() else None for f in files]
    before = stamps()
    t0 = time.time()
    k = n_prompts if sampled_prompts is None else max(0, min(n_prompts, sampled_prompts))
    every = training_prompts(n_prompts, seed, "train")
    tr, kinds = encode_prompts(engine, every[:k], max_prompt)
    more, mkinds = encode_prompts(engine, every[k:], max_prompt)
    va, vkinds = encode_prompts(engine, training_prompts(n_held, seed, "heldout"), max_prompt)
    kinds.update(mkinds)
    kinds.update(vkinds)
    rows = teacher_rows(engine, tr, gen_tokens, seed, files[0], "train", gen_batch)
    if more:
        rows += teacher_rows(engine, more, gen_tokens, seed, files[0], "train, greedy only", gen_batch, sampled=False)
    held = teacher_rows(engine, va, gen_tokens, seed + 7, files[1], "held-out", gen_batch)
    for r in rows + held:
        r["kind"] = kinds.get(tuple(r["prompt"]), "?")
    cached = None not in before and stamps() == before
    desc = (f"{len(tr) + len(more)} training prompts (paradec.training.prompts, disjoint from evals/suites; 9 kinds), "
            + (f"the first {len(tr)} with " if more else "")
            + "one sampled (T 0.7, top-k 50, top-p 0.95) and one greedy answer each by the target "
            + f"({dtype_name(engine)})"
            + (f", the other {len(more)} the greedy one only" if more else "")
            + f", up to {gen_tokens} tokens; {len(va)} held-out prompts from held-out modules")
    return Answers(rows, held, desc, 0.0 if cached else (time.time() - t0) / 60, cached)
