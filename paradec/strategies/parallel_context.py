"""`pcw`: Parallel Context Windows (Ratner et al., ACL 2023) - training-free long-context prefill.

The prompt is split into a long *context* and a final *question*. The context is cut into chunks of at
most `window` tokens that are encoded as ONE left-padded batch (`engine.prefill_batch`), every chunk with
positions restarting at 0, so attention during prefill costs O(n * (L/n)^2) instead of O(L^2). The
per-chunk key/values are then laid end to end in one single-sequence cache (padding dropped; a leading
BOS, when the tokenizer adds one, is encoded in every chunk but kept once). The question and the answer
get positions starting at the longest chunk's length and attend to every cached chunk position plus
themselves causally. Positions therefore never exceed `max chunk + question + max_new_tokens`, which is
how a prompt longer than the model's context can be read at all.

Where the question starts: at the last "\\n\\nQuestion:" if the text has one; otherwise at the last
paragraph break ("\\n\\n") when the final paragraph is at most `question_tokens` tokens long (the form of
the `longcontext` suite: "...\\n\\nWhat is the pass key? The pass key is"); otherwise the last
`question_tokens` tokens.

APE's training-free adjustments (Yang et al., ICLR 2025), as options (`ape` is this strategy with them on):
  * `prefix` N: the prompt's opening, up to and including its first blank line when that comes within N tokens
    (a chat template's head plus the instruction before the document), is put at the start of EVERY chunk
    (positions 0.., encoded once, every chunk's own tokens encoded after it), so no chunk starts cold; 0 shares
    only a BOS.
  * `temperature` T and `scale` S act in every pass after the chunks (the question's and each answer token's):
    its attention is split into three blocks, the prefix, the context and the rest (question and answer). With
    s the scaled scores q.k/sqrt(d), each block's log-mass is LSE(s) for the prefix and the rest but
    T * LSE(s/T) + log S for the context, and inside the context the weights follow softmax(s/T): the context is
    sharpened by T without its total weight growing, and that total is scaled by S. One softmax does it, over
    the scores with the context's columns replaced by s/T + (T - 1) * LSE(s/T) + log S (`ape_attention`, an
    attention function registered with transformers and switched on only around those passes).
With T = S = 1 and prefix 0 the computation is plain pcw.

Chunk selection, an option (`select` k > 0; off by default): after the batched chunk pass the whole question is
appended to every chunk row in one more batched pass (`probe_pass`), which gives two figures per chunk: the mean
log-probability of the question's own tokens under the chunk (the question-aware coarse ranking of LongLLMLingua,
Jiang et al., ACL 2024, and XL3M: a chunk holding what the question asks about makes its words likelier), and how
sure the model is of its answer's first token after that chunk alone. `rank` orders the chunks by one of them or,
by default, by both interleaved (`chunk_order`). Only the first k, in their order in the prompt, are laid end to
end for the question and the answer; the rest are dropped. The chunks are still encoded in parallel and never see
each other; what changes is that the answer no longer spreads its attention over n chunks of which one matters.
The step's `info` lists the kept chunks and the whole order.

Steps: the batched chunk encoding is one forward pass, two with a shared prefix, one more with `select` (a step
with no tokens, `info` = chunk layout);
the question pass yields the first token; then one token per forward pass like `ar`. With a single chunk
(and T = S = 1) the computation is the ordinary one, so greedy output equals `ar`. Not lossless with several
chunks: the chunks do not see each other.
"""
from __future__ import annotations

import math
import re
import threading
from contextlib import contextmanager, nullcontext

import torch

from ..decoding import one_token_steps
from .base import Param, Request, RequestError, Run, Step, Strategy, register, window_phrase

MARKER = re.compile(r"\n\nQuestion:")
PARAGRAPH = re.compile(r"\n\n\S")     # a blank line followed by text (not a chat template's tail)


def _last_suffix_with(engine, ids: list[int], pattern: re.Pattern) -> int | None:
    """Largest i such that the decoded suffix ids[i:] matches `pattern` somewhere (None when the whole text
    does not). A match only survives as the suffix grows, so a binary search needs O(log n) decodes."""
    if not ids or not pattern.search(engine.decode(ids)):
        return None
    lo, hi = 0, len(ids)          # has(lo) is true, has(hi) (the empty suffix) is false
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pattern.search(engine.decode(ids[mid:])):
            lo = mid
        else:
            hi = mid
    return lo


def question_start(engine, ids: list[int], question_tokens: int) -> int:
    """Index in `ids` where the question part begins (see the module doc). Leaves at least one context token
    when the prompt has more than one token."""
    n = len(ids)
    cut = _last_suffix_with(engine, ids, MARKER)
    if cut is None:
        para = _last_suffix_with(engine, ids, PARAGRAPH)
        cut = para if para is not None and 0 < n - para <= question_tokens else n - question_tokens
    return min(max(cut, 1 if n > 1 else 0), n)


def head_end(engine, ids: list[int], limit: int) -> int:
    """Length of the prompt's opening: the fewest leading tokens whose text holds a blank line ("\\n\\n"),
    when that is at most `limit` tokens; 0 otherwise. A blank line, once in a prefix, stays in every longer
    one, so a binary search needs O(log limit) decodes."""
    hi = min(limit, len(ids))
    if hi <= 0 or "\n\n" not in engine.decode(ids[:hi]):
        return 0
    lo = 0                      # has(lo) is false, has(hi) is true
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if "\n\n" in engine.decode(ids[:mid]):
            hi = mid
        else:
            lo = mid
    return hi


def plan_chunks(context: list[int], window: int, shared: list[int]) -> list[list[int]]:
    """Cut `context` into balanced chunks of at most `window` tokens, each starting with `shared` (a BOS)."""
    if not context:
        return []
    piece = window - len(shared)
    n = math.ceil(len(context) / piece)
    size = math.ceil(len(context) / n)
    return [shared + context[i:i + size] for i in range(0, len(context), size)]


@torch.inference_mode()
def encode_batch(engine, chunks: list[list[int]], shared_len: int = 0):
    """Encode the chunks as one batch, positions 0..len-1 in each: (batch cache, mask (n, L) of its real positions,
    next position of each row (n,)). A shared start longer than one token (APE's shared prefix: the same tokens at
    the same positions in every chunk) is encoded once and the chunks' own tokens as one batch after it (each row
    attends to that one prefix cache), so it costs one pass over it, not one per chunk; a BOS is simply encoded in
    every row (`chunk_passes` forward passes in all)."""
    if shared_len <= 1:
        _, bcache, mask, nxt = engine.prefill_batch(chunks)
        return bcache, mask, nxt
    prefix, bodies = chunks[0][:shared_len], [c[shared_len:] for c in chunks]
    pcache = engine.new_cache()
    engine.forward(prefix, pcache, logits_to_keep=1)
    n = len(chunks)
    _, bcache, mask, nxt = engine.prefill_batch(bodies, engine.repeat_cache(pcache, n),
                                                torch.ones(n, shared_len, dtype=torch.long, device=engine.device))
    return bcache, mask, nxt


def lay_end_to_end(engine, bcache, chunks: list[list[int]], shared_len: int = 0, keep: list[int] | None = None):
    """One single-sequence cache from `encode_batch`'s: the rows in `keep` (default all), in order, laid end to
    end - the first whole, every later one without its first `shared_len` tokens (the shared start kept once)."""
    keep = list(range(len(chunks))) if keep is None else list(keep)
    T = engine.cache_len(bcache)
    if shared_len <= 1:       # each row from its first real position; every row after the first without its BOS
        return engine.concat_rows(bcache, [T - len(chunks[i]) + (shared_len if j else 0) for j, i in enumerate(keep)],
                                  keep)
    P, first = shared_len, keep[0]   # the shared prefix (positions 0..P-1 of every row) once, then each row's own
    return engine.cache_from_kv([
        (torch.cat([k[first:first + 1, :, :P]] + [k[i:i + 1, :, T - len(chunks[i]) + P:] for i in keep], dim=-2),
         torch.cat([v[first:first + 1, :, :P]] + [v[i:i + 1, :, T - len(chunks[i]) + P:] for i in keep], dim=-2))
        for k, v in engine.cache_kv(bcache)])


@torch.inference_mode()
def encode_chunks(engine, chunks: list[list[int]], shared_len: int = 0):
    """Encode the chunks as one batch (`encode_batch`) and return one single-sequence cache holding chunk 0 whole
    and every later chunk without its first `shared_len` tokens."""
    bcache, _, _ = encode_batch(engine, chunks, shared_len)
    return lay_end_to_end(engine, bcache, chunks, shared_len)


def chunk_passes(shared_len: int) -> int:
    """Forward passes `encode_chunks` makes: one batch, plus one over a shared prefix longer than a token."""
    return 2 if shared_len > 1 else 1


@torch.inference_mode()
def probe_pass(engine, bcache, mask: torch.Tensor, nxt: torch.Tensor, question: list[int], probe: int | None = None):
    """The question appended to every row of `encode_batch`'s cache, in one batched pass (the cache is cropped back
    after). Returns (lp, answer): lp (n, probe - 1) float32, the log-probability of each of the question's first
    `probe` tokens (default all) after the first; answer (n,), the log-probability of the most likely next token
    after the whole question - how sure the model is of how its answer starts when it reads only that chunk."""
    q, n = len(question), mask.shape[0]
    probe = q if probe is None else min(probe, q)
    T = engine.cache_len(bcache)
    ids = torch.tensor([question] * n, device=engine.device)
    full = torch.cat([mask, torch.ones((n, q), dtype=mask.dtype, device=engine.device)], 1)
    positions = nxt.view(-1, 1).to(engine.device) + torch.arange(q, device=engine.device)
    logits = engine.forward(ids, bcache, positions, engine.batch_mask(full, q), upcast=False)   # (n, q, V)
    engine.crop(bcache, T)
    target = ids[0, 1:probe].view(-1, 1)
    lp = torch.stack([torch.log_softmax(row.float(), -1).gather(-1, target).view(-1)      # a row at a time
                      for row in logits[:, :probe - 1]]).cpu() if probe > 1 else torch.zeros(n, 0)
    answer = torch.stack([torch.log_softmax(row.float(), -1).max() for row in logits[:, -1]]).cpu()
    return lp, answer


def probe_tokens(engine, question: list[int]) -> list[int]:
    """The question's own tokens, whose likelihood `chunk_order` ranks by: without the chat template's closing tail
    (the same in every chat prompt: it says nothing about which chunk is relevant)."""
    from ..focus import chat_frame
    _, tail = chat_frame(engine)
    if tail and len(question) > len(tail) and question[-len(tail):] == tail:
        return question[:-len(tail)]
    return question


RULES = ("both", "question", "answer")


def chunk_order(lp: torch.Tensor, answer: torch.Tensor, rule: str = "both") -> list[int]:
    """Chunk indices, most relevant first, from `probe_pass`'s figures:
      * "question": by the mean log-probability of the question's tokens under the chunk - the question-aware
        coarse ranking of LongLLMLingua (Jiang et al., ACL 2024) and XL3M: a chunk that holds what the question asks
        about makes the question's own words likelier;
      * "answer": by how sure the model is of its answer's first token after that chunk and the question;
      * "both": the two orders interleaved, the answer's first (its best, the question's best, its second, ...),
        each chunk once."""
    n = answer.shape[0]
    by_q = sorted(range(n), key=lambda i: -float(lp[i].mean()) if lp.shape[1] else 0.0)
    by_a = sorted(range(n), key=lambda i: -float(answer[i]))
    if rule == "question":
        return by_q
    if rule == "answer":
        return by_a
    if rule != "both":
        raise ValueError(f"unknown chunk rule {rule!r}; rules: {', '.join(RULES)}")
    out: list[int] = []
    for pair in zip(by_a, by_q):
        out += [i for i in pair if i not in out]
    return out


def pick_chunks(order: list[int], select: int) -> list[int]:
    """The first `select` chunks of `order` (`chunk_order`), in their order in the prompt (all when select is 0 or
    no fewer than the chunks)."""
    if not select or select >= len(order):
        return sorted(order)
    return sorted(order[:select])


# ------------------------------------------------------------------------------------------ APE's query attention
_BLOCKS = threading.local()       # (lo, hi, T, S) while `context_blocks` is active in this thread
ATTENTION_NAME = "paradec_ape"


def ape_weights(scores: torch.Tensor, lo: int, hi: int, T: float, S: float) -> torch.Tensor:
    """Attention weights (…, Q, K) from additive-masked scores (…, Q, K) with APE's rule on the columns [lo, hi)
    (the context): softmax over the scores with those columns set to s/T + (T-1)*LSE(s/T) + log S."""
    ctx = scores[..., lo:hi].float() / T
    shift = (T - 1.0) * torch.logsumexp(ctx, dim=-1, keepdim=True) + math.log(S)
    adjusted = torch.cat([scores[..., :lo].float(), ctx + shift, scores[..., hi:].float()], dim=-1)
    return torch.softmax(adjusted, dim=-1)


def ape_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """A transformers attention function: eager attention with `ape_weights` on the active context block."""
    lo, hi, T, S = _BLOCKS.spec
    groups = query.shape[1] // key.shape[1]
    k = key.repeat_interleave(groups, dim=1) if groups > 1 else key
    v = value.repeat_interleave(groups, dim=1) if groups > 1 else value
    scores = torch.matmul(query, k.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask[..., :k.shape[-2]]
    w = ape_weights(scores, lo, hi, T, S).to(v.dtype)
    return torch.matmul(w, v).transpose(1, 2).contiguous(), None


def _register_attention() -> None:
    from transformers import AttentionInterface
    AttentionInterface.register(ATTENTION_NAME, ape_attention)


_register_attention()      # once, at import: not in every pass


@contextmanager
def context_blocks(engine, lo: int, hi: int, temperature: float, scale: float):
    """Run the enclosed forward passes with `ape_attention` on the cache columns [lo, hi) (the context)."""
    cfgs = [engine.model.config, engine.model.config.get_text_config(decoder=True)]
    old = [c._attn_implementation for c in cfgs]
    _BLOCKS.spec = (lo, hi, float(temperature), float(scale))
    try:
        for c in cfgs:
            c._attn_implementation = ATTENTION_NAME
        yield
    finally:
        for c, o in zip(cfgs, old):
            c._attn_implementation = o
        _BLOCKS.spec = None


@register
class ParallelContextWindows(Strategy):
    name = "pcw"
    title = "Parallel Context Windows"
    lossless = False
    accepts_long_prompts = True      # reads prompts longer than the model's context (it validates them itself)
    params = {
        "window": Param(0, int, 0, 1_000_000, "tokens per context chunk (0 = context length - question - "
                                              "max_new_tokens, at least 64)"),
        "question_tokens": Param(64, int, 1, 4096, "question length when the prompt has no question marker "
                                                   "or short final paragraph"),
        "max_chunks": Param(64, int, 1, 4096, "most context chunks encoded in one batch"),
        "prefix": Param(0, int, 0, 4096, "share the prompt's opening (up to its first blank line, when within this "
                                         "many tokens) at the start of every chunk, APE's shared prefix (0 = "
                                         "only a BOS)"),
        "temperature": Param(1.0, float, 0.05, 10.0, "attention temperature on the context: later scores over "
                                                     "context keys are divided by it (APE; 1 = off)"),
        "scale": Param(1.0, float, 0.01, 10.0, "the context's attention weights are multiplied by it (APE's "
                                               "scaling factor; 1 = off)"),
        "select": Param(0, int, 0, 4096, "keep only this many chunks, the most relevant to the question (one "
                                         "batched scoring pass; 0 = keep every chunk)"),
        "rank": Param("both", str, help="how `select` ranks the chunks: question (the question's likelihood "
                                        "under each chunk), answer (the model's certainty of its answer's first "
                                        "token after each chunk) or both (interleaved)", choices=RULES),
    }

    def available(self, engine) -> tuple[bool, str]:
        cfg = engine.model.config.get_text_config(decoder=True)
        if getattr(cfg, "sliding_window", None) or any("sliding" in str(t) for t in
                                                       (getattr(cfg, "layer_types", None) or [])):
            return False, "pcw concatenates full-attention caches; this model has sliding-window layers"
        return True, ""

    def layout(self, engine, request: Request) -> dict:
        """Validate the request and plan the chunks: {'ids', 'chunks', 'question', 'shared', 'window'}."""
        return self.plan(engine, request.validate(engine, long_ok=True), self.resolve_params(request, engine),
                         request.max_new_tokens, request.context(engine))

    def plan(self, engine, ids: list[int], p: dict, M: int, C: int | None = None) -> dict:
        """The chunks of a validated prompt `ids` under parameters `p`, `M` new tokens and a window of `C`
        positions (default the model's context) (see `layout`)."""
        q0 = question_start(engine, ids, p["question_tokens"])
        question, context = ids[q0:], ids[:q0]
        C = C or engine.context_length
        where = window_phrase(engine, C)
        window = p["window"] or max(64, C - len(question) - M)
        bos = getattr(engine.tokenizer, "bos_token_id", None)
        head = head_end(engine, context[:-1], p.get("prefix", 0))    # at least one context token left to chunk
        if head:
            shared = context[:head]
        else:
            shared = [bos] if bos is not None and len(context) > 1 and context[0] == bos else []
        if window <= len(shared):
            raise RequestError(f"pcw: window must be larger than {len(shared)}, got {window}")
        chunks = plan_chunks(context[len(shared):] if shared else context, window, shared)
        if len(chunks) > p["max_chunks"]:
            raise RequestError(
                f"pcw: the prompt is {len(ids)} tokens; its context part ({len(context)} tokens) needs "
                f"{len(chunks)} windows of {window} tokens, more than max_chunks={p['max_chunks']} "
                f"(at most {p['max_chunks'] * window} context tokens); shorten the prompt or raise max_chunks")
        longest = max((len(c) for c in chunks), default=0)
        if longest + len(question) + M > C:
            raise RequestError(
                f"pcw: the longest window ({longest} tokens) + the question ({len(question)} tokens) + "
                f"max_new_tokens ({M}) exceed {where}; lower window, "
                "question_tokens or max_new_tokens")
        return {"ids": ids, "chunks": chunks, "question": question, "shared": len(shared), "window": window}

    def steps(self, run: Run):
        engine, p = run.engine, run.params
        lay = self.plan(engine, run.ids, p, run.request.max_new_tokens, run.request.context(engine))
        chunks, question = lay["chunks"], lay["question"]
        info = {"chunks": len(chunks), "chunk_lengths": [len(c) for c in chunks], "window": lay["window"],
                "question_tokens": len(question), "shared_prefix": lay["shared"]}
        keep = list(range(len(chunks)))
        if chunks:
            bcache, mask, nxt = encode_batch(engine, chunks, lay["shared"])
            passes = chunk_passes(lay["shared"])
            if 0 < p.get("select", 0) < len(chunks):
                lp, answer = probe_pass(engine, bcache, mask, nxt, question, len(probe_tokens(engine, question)))
                order = chunk_order(lp, answer, p.get("rank", "both"))
                keep = pick_chunks(order, p["select"])
                passes += 1
                info.update(selected=keep, chunk_order=order)
            cache = lay_end_to_end(engine, bcache, chunks, lay["shared"], keep)
            del bcache
            yield Step(forward_passes=passes, prefill=True, info=info)
            info = {}
        else:
            cache = run.cache
        pos = max((len(chunks[i]) for i in keep), default=0)
        past = engine.cache_len(cache)
        ape = chunks and (p["temperature"] != 1.0 or p["scale"] != 1.0)
        blocks = (lambda: context_blocks(engine, lay["shared"], past, p["temperature"], p["scale"])) if ape \
            else nullcontext
        q = len(question)
        mask = engine.tree_mask(past, torch.ones(q, q, dtype=torch.bool).tril())
        with blocks():
            logits = engine.forward(question, cache, list(range(pos, pos + q)), mask, logits_to_keep=1,
                                    upcast=False)[0, -1]
        position = pos + q
        feed = None
        if ape:
            def feed(tok):       # every later pass reads the context under APE's rule too
                nonlocal position
                mask1 = engine.tree_mask(engine.cache_len(cache), torch.ones(1, 1, dtype=torch.bool))
                with blocks():
                    out = engine.forward([tok], cache, [position], mask1, logits_to_keep=1, upcast=False)[0, -1]
                position += 1
                return out, 1
        for st in one_token_steps(engine, run.out, logits, cache, sampling=run.sampling, us=run.us,
                                  position=pos + q, feed=feed):
            if st.prefill:
                st.info.update(info)
            yield st
