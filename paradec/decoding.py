"""The two decoding loops everything else is built from, each written once.

  * `one_token_steps` - one sequence, one token per forward pass: pick a token from the last logits (argmax,
    or inverse CDF with the output position's u), hand it to the `Output` (which applies EOS, the token
    budget and stop strings), yield the Step, and unless the output is done feed the token for the next
    logits. `ar`, the SoT skeleton, `pcw`, `focus` and the long-context eval's truncated baseline use it.
  * `batched_tokens` - a left-padded batch decoded together: one batched prefill, then one batched pass per
    token, rows that are done fed the pad token (their row stays in the batch, and the mask keeps every row
    to itself, so what a done row is fed changes no other row). SoT's point expansion uses it directly;
    `generate` (decode until EOS or a token budget, for teacher completions in training) is built on it.
"""
from __future__ import annotations

from typing import Callable, Iterator

import torch

from .sampling import SamplingParams, UStream, next_tokens


def pick_token(logits: torch.Tensor, sampling: SamplingParams, us: UStream | None, i: int) -> int:
    """The token for output position i from its logits (V,): argmax when greedy, else Pick(u_i, P)."""
    return int(next_tokens(logits, sampling, us[i] if us is not None else None))


def one_token_steps(engine, out, logits: torch.Tensor, cache=None, *, sampling: SamplingParams,
                    us: UStream | None, position: int | None = None, passes: int = 1,
                    feed: Callable[[int], tuple[torch.Tensor, int]] | None = None) -> Iterator:
    """Steps of plain autoregressive decoding from `logits` (V,), the prompt's last logits, until `out` is done.

    out: the `Output` that keeps the tokens and decides when to stop; the u of each token is
    `us[len(out.ids)]`. Each token is fed to `engine.forward` with `cache`, at `position`, `position`+1, ...
    when `position` is given (strategies whose cache positions are not 0..n-1), at the cache's next
    position otherwise. `feed(token) -> (next logits, forward passes)` replaces that (focus recomputes its
    candidates every k tokens). passes: forward passes the first Step reports (the prompt's own passes).
    The first Step has prefill=True. Callers may dress the Steps (segment, info, text) as they go by.
    """
    prefill = True
    while True:
        tok = pick_token(logits, sampling, us, len(out.ids))
        yield out.step([tok], forward_passes=passes, prefill=prefill)
        if out.done:
            return
        prefill = False
        if feed is not None:
            logits, passes = feed(tok)
            continue
        pos = None if position is None else [position]
        logits = engine.forward([tok], cache, pos, logits_to_keep=1, upcast=False)[0, -1]
        passes = 1
        if position is not None:
            position += 1


def batched_tokens(engine, rows: list[list[int]], choose: Callable[[torch.Tensor], torch.Tensor],
                   finished: Callable[[int], bool], cache=None, past_mask: torch.Tensor | None = None
                   ) -> Iterator[list[int]]:
    """Decode `rows` as one left-padded batch: yields the B tokens picked in each forward pass.

    rows: each row's token ids, after the optional shared `cache` (already repeated over the batch, its
    positions marked in `past_mask` (B, L)). choose(logits (B, V)) -> (B,) tokens. finished(i) tells whether
    row i is done; it is asked after every yield, so the caller records the tokens and applies its stop rule
    between passes. A finished row is fed the pad token; the batch ends when every row is finished.
    """
    logits, cache, mask, pos = engine.prefill_batch(rows, cache, past_mask)
    while True:
        toks = [int(t) for t in choose(logits).tolist()]
        yield toks
        done = [finished(i) for i in range(len(rows))]
        if all(done):
            return
        feed = torch.tensor([engine.pad_id if d else t for d, t in zip(done, toks)], dtype=torch.long,
                            device=engine.device)
        logits, mask = engine.decode_batch(feed, cache, mask, pos)
        pos = pos + 1


def generate(engine, prompts: list[list[int]], max_new: int, sp: SamplingParams = SamplingParams(), seed: int = 0,
             batch: int = 16, progress=None) -> list[list[int]]:
    """Completions of `prompts` by the engine itself, `batch` prompts at a time (left-padded), each ending at
    EOS (kept) or after max_new tokens. Sampled decoding draws each pass's u for every row of the batch from
    one generator seeded with `seed`. `progress.update(n)` is called after every batch when given."""
    gen = torch.Generator().manual_seed(seed)

    def choose(logits):
        u = None if sp.greedy else torch.rand(logits.shape[0], generator=gen, dtype=torch.float64).to(logits.device)
        return next_tokens(logits, sp, u)

    out: list[list[int]] = []
    for b in range(0, len(prompts), batch):
        rows = prompts[b:b + batch]
        comps: list[list[int]] = [[] for _ in rows]
        done = [max_new <= 0] * len(rows)
        if not all(done):
            for toks in batched_tokens(engine, rows, choose, done.__getitem__):
                for i, t in enumerate(toks):
                    if not done[i]:
                        comps[i].append(t)
                        done[i] = t in engine.eos_ids or len(comps[i]) >= max_new
        out.extend(comps)
        if progress is not None:
            progress.update(len(rows))
    return out
