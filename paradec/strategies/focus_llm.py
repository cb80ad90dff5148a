"""`focus`: FocusLLM (Li et al., arXiv 2408.11745) - a trained way to read prompts longer than the context.

The prompt is split like `pcw` splits it: a long *memory* and a final *question* (the local context; same
rule, `question_tokens`). The memory is cut into chunks of at most `window` tokens, encoded as ONE batch
(positions restarting at 0 in every chunk). Then one batched candidate pass appends the last `dynamic`
tokens of the local context to every chunk and turns the last of them into that chunk's candidate token
(trained q/k/v/o projections at that position only); the local context then attends to the n candidates
(positions 0..n-1) and to itself, and decodes like `ar`. See `paradec/focus.py` for the model side.

Parameters trained with a *sink* (the default since the default model's: see paradec/focus.py `sink_kv`) put the
prompt's opening (`sink_length`) before the candidates, encoded by the base model at positions 0..s-1, and the
candidates at s..s+n-1; the memory is the rest of the context part.

A prompt that fits the context (prompt + max_new_tokens <= context) has no memory: it is decoded by the base
model alone, token for token `ar`.

Steps: the chunk encoding (one pass, no token); the candidate pass + the local-context pass (two passes,
the first token); then one token per pass. With `refresh` = k the candidates are recomputed from the newest
dynamic prompt every k tokens (two more passes each time). Not lossless: the model never sees the memory
itself, only what the candidates carry. Needs trained parameters (`python -m paradec train focus`).
"""
from __future__ import annotations

import torch

from .. import focus as F
from ..decoding import one_token_steps
from .base import Param, Request, RequestError, Run, Step, Strategy, register, trained_availability, window_phrase
from .parallel_context import head_end, plan_chunks, question_start


def sink_length(engine, memory: list[int]) -> int:
    """How many of the memory's first tokens open the local context as its sink (parameters trained with one,
    paradec/focus.py `sink_kv`): the model's chat head when the prompt starts with it (what the trainer puts
    there), else the prompt's opening up to its first blank line (at most 256 tokens), else its first token."""
    head = F.chat_frame(engine)[0]
    if head and memory[:len(head)] == head and len(memory) > len(head):
        return len(head)
    return min(max(1, head_end(engine, memory, 256)), max(0, len(memory) - 1)) if memory else 0


@register
class FocusLLM(Strategy):
    name = "focus"
    title = "FocusLLM"
    lossless = False
    accepts_long_prompts = True
    params = {
        "window": Param(0, int, 0, 1_000_000, "tokens per memory chunk (0 = context length - dynamic prompt)"),
        "question_tokens": Param(64, int, 1, 4096, "local-context length when the prompt has no question "
                                                   "marker or short final paragraph"),
        "max_chunks": Param(64, int, 1, 4096, "most memory chunks encoded in one batch"),
        "refresh": Param(0, int, 0, 4096, "recompute the candidates every k generated tokens (0 = once, "
                                          "from the prompt)"),
        "adapter": Param("", str, help="FocusLLM parameters folder (default: <model>/focus, made by `train focus`)"),
    }

    def available(self, engine) -> tuple[bool, str]:
        return trained_availability("the FocusLLM parameters", lambda: F.adapter_for(engine), lambda ad: True,
                                    F.hint(engine))       # adapter_for refuses parameters made for another model

    def layout(self, engine, request: Request, dynamic: int, sink: bool = False) -> dict:
        """Validate the request and plan the memory chunks: {'chunks', 'question', 'sink', 'window', 'refresh'}."""
        return self.plan(engine, request.validate(engine, long_ok=True), self.resolve_params(request, engine),
                         request.max_new_tokens, dynamic, request.context(engine), sink)

    def plan(self, engine, ids: list[int], p: dict, M: int, dynamic: int, C: int | None = None,
             sink: bool = False) -> dict:
        """The layout of a validated prompt `ids` under parameters `p`, `M` new tokens, a `dynamic`-token
        dynamic prompt and a window of `C` positions (default the model's context) (see `layout`). With `sink`
        (parameters trained with one), the prompt's opening is the local context's sink (`sink_length`)."""
        C = C or engine.context_length
        where = window_phrase(engine, C)
        # a prompt that fits the context needs no memory: the base model reads it whole, exactly as `ar`
        q0 = 0 if len(ids) + M <= C else question_start(engine, ids, p["question_tokens"])
        s = sink_length(engine, ids[:q0]) if sink and q0 else 0
        question, memory, sink_ids = ids[q0:], ids[s:q0], ids[:s]
        window = p["window"] or C - dynamic
        if window < 1 or window + dynamic > C:
            raise RequestError(f"focus: window must be between 1 and {C - dynamic} (the context of {C} tokens minus "
                               f"the {dynamic}-token dynamic prompt), got {window}")
        chunks = plan_chunks(memory, window, [])
        if len(chunks) > p["max_chunks"]:
            raise RequestError(
                f"focus: the prompt's memory part ({len(memory)} tokens) needs {len(chunks)} chunks of {window} "
                f"tokens, more than max_chunks={p['max_chunks']}; shorten the prompt or raise max_chunks")
        if s + len(chunks) + len(question) + M > C:
            raise RequestError(
                f"focus: {f'the {s}-token sink + ' if s else ''}{len(chunks)} candidate positions + the question "
                f"({len(question)} tokens) + max_new_tokens ({M}) exceed {where}; raise window or lower "
                "question_tokens or max_new_tokens")
        return {"chunks": chunks, "question": question, "sink": sink_ids, "window": window, "refresh": p["refresh"]}

    def steps(self, run: Run):
        engine, request = run.engine, run.request
        ad = run.hold(F.FocusAdapter.require(engine, run.params["adapter"] or None).attached(engine.model))
        lay = self.plan(engine, run.ids, run.params, request.max_new_tokens, ad.dynamic, request.context(engine),
                        sink=bool(ad.meta.get("sink")))
        chunks, local = lay["chunks"], list(lay["question"])
        n, s = len(chunks), len(lay["sink"])
        out = run.out
        tail = F.chat_frame(engine)[1] if ad.meta.get("sink") else []    # parameters of the sink era skip the chat tail
        info = {"chunks": n, "chunk_lengths": [len(c) for c in chunks], "window": lay["window"],
                "question_tokens": len(local),
                "dynamic_prompt": len(F.dynamic_prompt(local, ad.dynamic, tail)), "sink_tokens": s}
        enc = skv = None
        if chunks:
            with torch.inference_mode():
                _, ccache, cmask, cnext = engine.prefill_batch(chunks)
                skv = F.sink_kv(engine, lay["sink"])      # its own pass, counted in this step
            enc = (ccache, cmask, cnext)
            yield Step(forward_passes=2 if s else 1, prefill=True, info=info)   # the chunks (and the sink)
            info = {}

        def encode_local(tokens: list[int]):
            """Candidates from the newest dynamic prompt, then the local tokens on top: last logits, cache."""
            with torch.inference_mode():
                if enc is None:
                    cache = engine.new_cache()
                else:
                    dyn = torch.tensor(F.dynamic_prompt(tokens, ad.dynamic, tail), dtype=torch.long).expand(n, -1)
                    cache = F.local_cache(engine, F.candidate_pass(engine, ad, enc[0], enc[1], enc[2], dyn, offset=s),
                                          skv)
                logits = engine.forward(tokens, cache, list(range(s + n, s + n + len(tokens))),
                                        logits_to_keep=1)[0, -1]
            return logits, cache

        logits, cache = encode_local(local)
        since = 0

        def feed(tok: int):
            """The next logits after `tok`: fresh candidates every `refresh` tokens, else one pass on the cache."""
            nonlocal cache, since
            since += 1
            if lay["refresh"] and enc is not None and since >= lay["refresh"]:
                since = 0
                logits, cache = encode_local(local + out.ids)
                return logits, 2
            pos = s + n + len(local) + len(out.ids) - 1
            return engine.forward([tok], cache, [pos], logits_to_keep=1)[0, -1], 1

        for st in one_token_steps(engine, out, logits, sampling=run.sampling, us=run.us,
                                  passes=2 if enc is not None else 1, feed=feed):
            if st.prefill:
                st.info.update(info)
            yield st
