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

Steps: the batched chunk encoding is one forward pass (a step with no tokens, `info` = chunk layout);
the question pass yields the first token; then one token per forward pass like `ar`. With a single chunk
the computation is the ordinary one, so greedy output equals `ar`. Not lossless with several chunks: the
chunks do not see each other.
"""
from __future__ import annotations

import math
import re

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


def plan_chunks(context: list[int], window: int, shared: list[int]) -> list[list[int]]:
    """Cut `context` into balanced chunks of at most `window` tokens, each starting with `shared` (a BOS)."""
    if not context:
        return []
    piece = window - len(shared)
    n = math.ceil(len(context) / piece)
    size = math.ceil(len(context) / n)
    return [shared + context[i:i + size] for i in range(0, len(context), size)]


@torch.inference_mode()
def encode_chunks(engine, chunks: list[list[int]], shared_len: int = 0):
    """Encode the chunks as one batch (one forward pass), positions 0..len-1 in each, and return one
    single-sequence cache holding chunk 0 whole and every later chunk without its first `shared_len` tokens."""
    _, bcache, mask, _ = engine.prefill_batch(chunks)
    T = mask.shape[1]
    return engine.concat_rows(bcache, [T - len(c) + (shared_len if i else 0) for i, c in enumerate(chunks)])


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
        engine = run.engine
        lay = self.plan(engine, run.ids, run.params, run.request.max_new_tokens, run.request.context(engine))
        chunks, question = lay["chunks"], lay["question"]
        info = {"chunks": len(chunks), "chunk_lengths": [len(c) for c in chunks], "window": lay["window"],
                "question_tokens": len(question)}
        pos = max((len(c) for c in chunks), default=0)
        if chunks:
            cache = encode_chunks(engine, chunks, lay["shared"])
            yield Step(forward_passes=1, prefill=True, info=info)
            info = {}
        else:
            cache = run.cache
        past = engine.cache_len(cache)
        q = len(question)
        mask = engine.tree_mask(past, torch.ones(q, q, dtype=torch.bool).tril())
        logits = engine.forward(question, cache, list(range(pos, pos + q)), mask, logits_to_keep=1,
                                upcast=False)[0, -1]
        for st in one_token_steps(engine, run.out, logits, cache, sampling=run.sampling, us=run.us,
                                  position=pos + q):
            if st.prefill:
                st.info.update(info)
            yield st
