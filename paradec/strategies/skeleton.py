"""`sot` and `sot-r`: Skeleton-of-Thought (Ning et al., ICLR 2024) with truly batched point expansion.

Stage 1 (skeleton). The model is asked for a short numbered outline; the assistant turn is pre-filled with
"1.". One Step per forward pass, segment 0, `stage='skeleton'`, `planning=True` (not part of the answer).
The text is parsed into points (`parse_skeleton`); with fewer than two points SoT makes no sense and the
strategy falls back to plain autoregressive decoding of the question (`stage='fallback'`,
`info={'fallback': reason}`, answer in segment 1). A skeleton given with the request (`Request.skeleton`:
tests, replays) replaces stage 1.

Stage 2 (expansion). One prompt per point b: the conversation, the cleaned skeleton, and an instruction to
write point b only, with the assistant turn pre-filled with "b. <point>". All points are expanded as ONE
left-padded batch:
  * the shared prefix (the longest run of tokens common to every expansion prompt) is prefilled once at
    batch size 1 - reusing the skeleton stage's KV cache for whatever part of it the skeleton pass already
    computed - and its cache is repeated over the batch;
  * the per-point suffixes are prefilled together by `engine.prefill_batch` (attention mask + per-row
    position ids, so left padding changes nothing), then decoded together by `engine.decode_batch`.
Each batched forward pass yields one Step per point that received a token (or finished) in that pass,
segment = point index (1-based); the first of them carries forward_passes=1, the others 0, so the sum of
forward_passes over the stream is exactly the number of model calls. A finished point keeps decoding a pad
token (its row is still in the batch) but emits nothing; the stage ends when every point is done.

Token budget rule. The skeleton has its own budget (`skeleton_max_tokens`, clipped to the context); it is
planning overhead and is not part of the answer. `request.max_new_tokens` bounds the answer, the sum over the
points: with n points each point may generate min(point_max_tokens, max_new_tokens // n) tokens, so the sum
never exceeds max_new_tokens (if n > max_new_tokens only the first max_new_tokens points are expanded, one
token each - a degenerate case). The fallback answers with the full max_new_tokens, exactly like `ar`.

Sequential expansion (`expansion`="sequential", registered as `sot-seq`): the same prompts, each point
expanded alone after the previous one finished, each from its own copy of the skeleton pass's cache - the
same text token for token (test), produced the way a plain one-sequence decoder would produce it; the
ratio of the two is what batching the points gains on the machine at hand.

Answer. Segment 0 is the skeleton and is NOT part of the answer; the answer is the points in order,
each "b. <point>" (its header, taken from the skeleton, is prepended to the text of the point's first Step)
followed by its expansion, joined with newlines. The last Step's `answer` holds the assembled answer. Only
the question and this answer belong in a conversation's history: see `sot_history`.

Sampling. The skeleton uses the request's u stream (seed); point b uses its own stream seeded with
`point_seed(seed, b)`, so a point's sample does not depend on how many other points share its batch.
"""
from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import dataclass

import torch

from ..decoding import batched_tokens, one_token_steps
from ..quality import content_stems
from ..sampling import UStream, next_tokens
from .base import Output, Param, Request, RequestError, Run, Step, Strategy, get, register

MAX_POINT_WORDS = 16


# ---------------------------------------------------------------------------------------------- templates
@dataclass(frozen=True)
class Template:
    """How the two SoT prompts are phrased. `{question}`, `{skeleton}` and `{b}` are filled in."""
    name: str
    skeleton_user: str          # the user turn of the skeleton stage
    expand_user: str            # the user turn asking for point b
    expand_after_skeleton: bool  # True: [question, assistant skeleton, expand_user]; False: one user turn
    expand_prefix: str = "{b}. {point}"   # the pre-filled start of point b's answer (also its header)

    def header(self, b: int, point: str) -> str:
        return self.expand_prefix.format(b=b, point=point)

    def skeleton_messages(self, history: list[dict], question: str) -> list[dict]:
        return history + [{"role": "user", "content": self.skeleton_user.format(question=question)}]

    def expansion_messages(self, history: list[dict], question: str, skeleton: str, b: int) -> list[dict]:
        if self.expand_after_skeleton:
            return history + [{"role": "user", "content": self.skeleton_user.format(question=question)},
                              {"role": "assistant", "content": skeleton},
                              {"role": "user", "content": self.expand_user.format(b=b)}]
        return history + [{"role": "user",
                           "content": self.expand_user.format(question=question, skeleton=skeleton, b=b)}]


TEMPLATES = {
    # The default model was trained on exactly this conversation shape (paradec/training/corpus.py):
    # user "Outline the module `json`." -> "1. dumps: ...\n2. ..."; user "Expand point 2 of that outline."
    # -> "2. <point>. `sig`: one or two sentences". The question goes in unchanged.
    "paradec-tiny": Template("paradec-tiny", "{question}", "Expand point {b} of that outline.", True),
    # For general chat models: the SoT paper's two prompts, in our own words (an outline of 3-10 points of
    # 3-5 words; then "write only point b, in one or two sentences"), with one worked example of a skeleton
    # (a 0.5B model otherwise writes the full answer, or repeats one point ten times). Point b's answer is
    # pre-filled with "b. <point>:" so the model goes on to explain the point instead of ending it.
    "generic": Template(
        "generic",
        "You plan answers; you do not write them. Give only the skeleton of the answer: a numbered list of "
        "3 to 8 different points, each only 3 to 5 words, no sentences, no details, nothing after the list.\n\n"
        "Example question: Why do people keep a vegetable garden?\nExample skeleton:\n1. Fresh food\n"
        "2. Lower grocery costs\n3. Outdoor exercise\n4. Knowing what you eat\n5. Less packaging waste\n\n"
        "Question: {question}\nSkeleton:",
        "You are writing one point, and one point only, of an answer to the question below.\n\n"
        "Question: {question}\n\nThe skeleton of the answer:\n{skeleton}\n\n"
        "Write point {b} and only point {b}: one or two sentences that explain it. "
        "Do not repeat the question and do not continue with any other point.",
        False, expand_prefix="{b}. {point}:"),
}


def template_for(params: dict, engine=None) -> Template:
    """The prompt template a run uses: the `template` parameter, `auto` meaning the model profile's choice."""
    name = params["template"]
    if name == "auto":
        name = getattr(getattr(engine, "profile", None), "sot_template", "generic")
    return TEMPLATES[name]


def skeleton_prefix() -> str:
    return "1."


def point_prefix(b: int, point: str) -> str:
    return f"{b}. {point}"


def point_seed(seed: int, b: int) -> int:
    return (int(seed) + 7919 * int(b)) % (2 ** 63)


# ---------------------------------------------------------------------------------------------- parsing
_POINT = re.compile(r"^\s*(?:[-*]\s*)?(?:\*\*)?(\d{1,3})\s*[.)]\s*(?:\*\*)?\s*(.*?)\s*$")


def parse_skeleton(text: str, max_points: int = 10) -> list[str]:
    """Points of a numbered skeleton, in order, cleaned.

    Lines that do not start with `N.` / `N)` are ignored (junk, preambles). A repeated index keeps its first
    occurrence; indexes that go backwards are treated as repeats (the model started the list over). Gaps are
    closed by renumbering: the result is just the ordered list, point b is result[b-1]. Points are stripped
    of markdown emphasis and trailing punctuation and cut to MAX_POINT_WORDS words; empty points are dropped,
    and so are near-duplicates: a point whose content words (5-letter stems) are for at least 80% shared
    with an earlier point's, or all (two or more) contained in it or containing it (a small model's skeleton
    often repeats itself: "Improved mood", "Improves mood"; "Better sleep", "Better sleep quality"). At most
    `max_points` are kept.
    """
    points, seen, last, stems = [], set(), 0, []
    for line in text.splitlines():
        m = _POINT.match(line)
        if not m:
            continue
        idx, body = int(m.group(1)), m.group(2)
        if idx in seen or idx <= last:
            continue
        body = body.replace("**", "").strip().rstrip(".;,").strip()
        words = body.split()
        if not words:
            continue
        seen.add(idx)
        last = idx
        st = content_stems(body) or {body.lower()}
        if any(_same_point(st, o) for o in stems):
            continue
        stems.append(st)
        points.append(" ".join(words[:MAX_POINT_WORDS]))
        if len(points) >= max_points:
            break
    return points


def _same_point(a: set, b: set) -> bool:
    """Near-duplicate points: >= 80% of their stems shared, or one's stems (two or more) all in the other's."""
    small = min(len(a), len(b))
    return len(a & b) >= 0.8 * len(a | b) or (small >= 2 and len(a & b) == small)


def render_skeleton(points: list[str]) -> str:
    return "\n".join(point_prefix(b, p) for b, p in enumerate(points, 1))


def split_question(request: Request) -> tuple[list[dict], str]:
    """(history, question): the conversation before the last user turn, and that turn's text."""
    if request.messages:
        if request.messages[-1].get("role") != "user":
            raise RequestError("sot: the last message must be the user's question")
        return [dict(m) for m in request.messages[:-1]], request.messages[-1]["content"]
    return [], request.prompt


def sot_history(messages: list[dict], answer: str) -> list[dict]:
    """The conversation for the next turn: the messages up to and including the question, then the answer.

    The skeleton prompt, the skeleton and the expansion prompts are scaffolding and never enter the history.
    """
    return [dict(m) for m in messages] + [{"role": "assistant", "content": answer}]


def _lcp(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def shared_prefix_len(prompts: list[list[int]]) -> int:
    """Tokens common to every prompt, leaving each prompt at least one token of its own."""
    n = min(len(p) for p in prompts) - 1
    for p in prompts[1:]:
        n = min(n, _lcp(prompts[0], p))
    return max(n, 0)


# ---------------------------------------------------------------------------------------------- expansion
def expand_points(engine, request: Request, prompts: list[list[int]], outs: list[Output],
                  streams: list[UStream | None], prefix: tuple | None = None, headers: list[str] | None = None):
    """Expand all prompts as one batch. Yields, per forward pass, the list of Steps of that pass.

    prompts: the full token ids of every expansion prompt; outs: one Output per point (its budget is the
    point's budget); streams: per-point u streams (None under greedy decoding); prefix: optional
    (cache, ids) of a batch-1 KV cache whose first positions hold `ids` (the skeleton pass), reused for the
    shared prefix and consumed; headers: text prepended to each point's first Step.
    """
    sp = request.sampling
    B = len(prompts)
    L = shared_prefix_len(prompts)
    shared = prompts[0][:L]
    cache, past_mask = None, None
    if L > 0:
        have = 0
        if prefix is not None:
            cache, ids = prefix
            have = min(_lcp(list(ids), shared), engine.cache_len(cache))
            if have == 0:
                cache = None
            else:
                engine.crop(cache, have)
        if cache is None:
            cache = engine.new_cache()
        if have < L:
            engine.forward(shared[have:], cache, positions=list(range(have, L)), logits_to_keep=1)
            yield [Step(segment=1, forward_passes=1, prefill=True, stage="expand-prefix",
                        info={"shared_tokens": L, "reused_tokens": have})]
        cache.batch_repeat_interleave(B)
        past_mask = torch.ones((B, L), dtype=torch.long, device=engine.device)

    def choose(logits):
        u = None if sp.greedy else torch.tensor([streams[i][len(outs[i].ids)] for i in range(B)], dtype=torch.float64)
        return next_tokens(logits, sp, u)

    first_pass, started = True, [False] * B
    for toks in batched_tokens(engine, [p[L:] for p in prompts], choose, lambda i: outs[i].done, cache, past_mask):
        steps = []
        for i in range(B):
            if outs[i].done:
                continue
            st = outs[i].step([toks[i]], segment=i + 1, stage="expand", info={"point": i + 1, "batch": B})
            if not started[i]:
                started[i] = True
                if headers:
                    st.text = headers[i] + st.text
            steps.append(st)
        steps[0].forward_passes = 1
        steps[0].prefill = first_pass
        if first_pass:
            steps[0].info.update(shared_tokens=L, suffix_tokens=[len(p) - L for p in prompts])
        first_pass = False
        yield steps


def point_budgets(n: int, max_new_tokens: int, point_max_tokens: int) -> list[int]:
    """Per-point budgets: min(point_max_tokens, max_new_tokens // n); never more than max_new_tokens in all."""
    if n > max_new_tokens:
        return [1] * max_new_tokens
    return [max(1, min(point_max_tokens, max_new_tokens // n))] * n


def given_points(forced, max_points: int) -> list[str]:
    """The points of a skeleton given with the request (`Request.skeleton`: its text, or the list of points)."""
    if isinstance(forced, str):
        return parse_skeleton(forced, max_points)
    return [str(x).strip() for x in forced][:max_points]


def skeleton_complete(text: str, max_points: int = 10) -> bool:
    """Whether a skeleton being written is over: `max_points` points parsed, or at least two points followed by
    a finished line that is not a numbered point (the model has moved on to prose or to details)."""
    lines = text.split("\n")
    if len(parse_skeleton(text, max_points)) >= max_points and text.endswith("\n"):
        return True
    seen = 0
    for line in lines[:-1]:             # complete lines only
        if _POINT.match(line):
            seen += 1
        elif line.strip() and seen >= 2:
            return True
    return False


def skeleton_steps(steps, max_points: int, end_stage: bool = False):
    """The skeleton stage's Steps, dressed as SoT shows them: segment 0, stage 'skeleton', planning, the pre-filled
    "1." in front of the first text, and on the finishing Step the skeleton and its points. Returns the points.
    The stage ends when the model ends it or when the skeleton is complete (`skeleton_complete`): a model that
    goes on to write the answer's prose after its outline is not waited for.
    end_stage: clear the finishing Step's finished flag (the answer is still to come)."""
    text, first, points = "", True, None
    try:
        for st in steps:
            st.segment, st.stage, st.planning = 0, "skeleton", True
            if first:
                st.text = skeleton_prefix() + st.text
                first = False
            text += st.text
            if not st.finished and "\n" in st.text and skeleton_complete(text, max_points):   # a line ended
                st.finished, st.finish_reason = True, "stop"
            if st.finished:
                points = parse_skeleton(text, max_points)
                st.info.update(skeleton=text, points=points)
                if end_stage:
                    st.finished, st.finish_reason = False, None
                yield st
                break
            yield st
    finally:
        if hasattr(steps, "close"):     # ended early: release the decoding loop (a remote stream closes)
            steps.close()
    return points if points is not None else parse_skeleton(text, max_points)


def fallback_reason(source: str, points: list[str]) -> str:
    n = len(points)
    return (f"the {source} has {n} point{'s' if n != 1 else ''}; "
            "SoT needs at least 2, answering autoregressively")


def point_plan(points: list[str], request: Request, p: dict, tpl: Template) -> tuple[list[str], list[int], list[str]]:
    """(points kept, their token budgets, their headers - the template's "b. <point>" form) for the expansion."""
    budgets = point_budgets(len(points), request.max_new_tokens, p["point_max_tokens"])
    points = points[:len(budgets)]
    return points, budgets, [tpl.header(b, pt) for b, pt in enumerate(points, 1)]


def point_stop(request: Request, b: int) -> list[str]:
    """Point b's stop strings: the request's, the start of the next point, and a blank line (a point is one
    paragraph)."""
    return list(request.stop) + [f"\n{b + 1}.", "\n\n"]


def finish_answer(step: Step, points: list[str], texts: list[str], tokens: list[int], reasons: list) -> Step:
    """Dress the last Step of SoT: its `answer` (every point's text, header included, one per line) and, in its
    info, the points and each point's token count and finish reason."""
    step.answer = "\n".join(texts)
    step.info.update(points=points, point_tokens=tokens, finish_reasons=reasons)
    return step


SOT_PARAMS = {
    "max_points": Param(10, int, 2, 10, help="most skeleton points kept"),
    "point_max_tokens": Param(48, int, 1, 1024, help="most tokens one point may generate"),
    "skeleton_max_tokens": Param(128, int, 8, 1024, help="most tokens the skeleton may take"),
    "template": Param("auto", str, choices=("auto",) + tuple(TEMPLATES),
                      help="prompt wording: auto (the model profile's), paradec-tiny (that model's training "
                           "format) or generic (SoT paper)"),
    "expansion": Param("batched", str, choices=("batched", "sequential"),
                       help="batched: every point in one batch; sequential: one point after another, each from "
                            "its own copy of the skeleton's cache (the same text, produced the way a plain "
                            "decoder would: the baseline that measures what batching gains)"),
}


@register
class SkeletonOfThought(Strategy):
    name = "sot"
    title = "Skeleton-of-Thought"
    lossless = False
    params = SOT_PARAMS
    encodes_prompt = False       # SoT writes its own prompts from the question

    def steps(self, run: Run):
        engine, request, p = run.engine, run.request, run.params
        tpl = template_for(p, engine)
        history, question = split_question(request)
        plain = dataclasses.replace(request, stop=[], assistant_prefix="", params={}, skeleton=None)

        # ---- stage 1: the skeleton
        forced = request.skeleton
        prefix = None
        if forced is not None:   # tests and replays: a given skeleton, no skeleton pass
            points, source = given_points(forced, p["max_points"]), "given skeleton"
        else:
            sk_msgs = tpl.skeleton_messages(history, question)
            sk_ids = engine.encode_messages(sk_msgs, skeleton_prefix())
            room = request.context(engine) - len(sk_ids)
            if room < 2:
                raise RequestError(f"sot: the skeleton prompt is {len(sk_ids)} tokens; it leaves no room in "
                                   f"{request.context_phrase(engine)}")
            sk_req = dataclasses.replace(plain, max_new_tokens=min(p["skeleton_max_tokens"], room))
            out, cache = Output(engine, sk_req), run.cache
            logits = engine.forward(sk_ids, cache, logits_to_keep=1, upcast=False)[0, -1]
            points = yield from skeleton_steps(one_token_steps(engine, out, logits, cache, sampling=run.sampling,
                                                               us=run.us), p["max_points"])
            # the cache holds the skeleton prompt and every token fed back, i.e. all but the last one picked
            prefix = (cache, (list(sk_ids) + out.ids)[:engine.cache_len(cache)])
            source = "skeleton"

        # ---- fallback: nothing to parallelise
        if len(points) < 2:
            yield from _fallback(engine, request, fallback_reason(source, points))
            return

        # ---- stage 2: all points in one batch
        skeleton = render_skeleton(points)
        prompts = [engine.encode_messages(tpl.expansion_messages(history, question, skeleton, b), tpl.header(b, pt))
                   for b, pt in enumerate(points, 1)]
        room = request.context(engine) - max(len(x) for x in prompts)
        if room < 1:
            yield from _fallback(engine, request, f"the expansion prompts ({max(len(x) for x in prompts)} tokens) "
                                                  f"do not fit {request.context_phrase(engine)}")
            return
        points, budgets, headers = point_plan(points, request, p, tpl)
        prompts = prompts[:len(points)]
        budgets = [min(b, room) for b in budgets]
        outs = [Output(engine, dataclasses.replace(request, stop=point_stop(request, b)), budget=bud)
                for b, bud in enumerate(budgets, 1)]
        streams = [None if request.sampling.greedy else UStream(point_seed(request.seed, b))
                   for b in range(1, len(points) + 1)]
        if p["expansion"] == "batched":
            groups = [(prompts, outs, streams, prefix, headers)]
        else:   # one point at a time; each starts from its own copy of the skeleton pass's cache
            groups = [([prompts[i]], [outs[i]], [streams[i]],
                       None if prefix is None else (engine.copy_cache(prefix[0]), prefix[1]), [headers[i]])
                      for i in range(len(prompts))]
        last = None
        for gi, (g_prompts, g_outs, g_streams, g_prefix, g_headers) in enumerate(groups):
            for steps in expand_points(engine, request, g_prompts, g_outs, g_streams, g_prefix, g_headers):
                if len(groups) > 1:
                    for st in steps:
                        st.segment, st.info["point"] = gi + 1, gi + 1
                if last is not None:
                    yield last
                for st in steps[:-1]:
                    yield st
                last = steps[-1]
        yield finish_answer(last, points, [h + o.text for h, o in zip(headers, outs)], [len(o.ids) for o in outs],
                            [o.finish_reason for o in outs])


def _fallback(engine, request: Request, why: str):
    """Plain `ar` on the original question, in segment 1; the reason on the first Step."""
    yield from fallback_steps(get("ar").stream(engine, dataclasses.replace(request, params={}, skeleton=None)), why)


def fallback_steps(steps, why: str):
    """Autoregressive fallback steps as SoT output: segment 1, the reason on the first, the answer on the last."""
    text, first, prev = "", True, None
    for st in steps:
        st.segment = 1
        if first:
            st.stage = "fallback"
            st.info["fallback"] = why
            first = False
        text += st.text
        if prev is not None:
            yield prev
        prev = st
    prev.answer = text
    yield prev


# ---------------------------------------------------------------------------------------------- SoT-R
@register
class SequentialSkeletonOfThought(SkeletonOfThought):
    """`sot-seq`: `sot` with expansion=sequential - the same answer written one point after another. It is
    the baseline that shows what batching the points gains, in one run or side by side in the Arena."""
    name = "sot-seq"
    title = "Skeleton-of-Thought, points one after another (baseline)"
    params = dict(SOT_PARAMS, expansion=dataclasses.replace(SOT_PARAMS["expansion"], default="sequential"))


@register
class RoutedSkeletonOfThought(Strategy):
    name = "sot-r"
    title = "Skeleton-of-Thought with router"
    lossless = False
    params = dict(SOT_PARAMS, threshold=Param(0.5, float, 0.0, 1.0,
                                              help="route to SoT when P(list-style) is at least this"))
    encodes_prompt = False       # it hands the request on to `sot` or `ar`

    def steps(self, run: Run):
        from ..router import load_router
        engine, request, p = run.engine, run.request, run.params
        _, question = split_question(request)
        t0 = time.perf_counter()
        router = load_router()
        prob = router.prob(question)
        route = "sot" if prob >= p["threshold"] else "ar"
        note = {"route": route, "p_list": round(prob, 4), "router": router.source,
                "router_ms": round(1000 * (time.perf_counter() - t0), 3)}
        if route == "ar":
            inner = get("ar").stream(engine, dataclasses.replace(request, params={}, skeleton=None))
        else:
            sot_params = {k: v for k, v in p.items() if k != "threshold"}
            inner = get("sot").stream(engine, dataclasses.replace(request, params=sot_params))
        first = True
        for st in inner:
            if first:
                st.info.update(note)
                first = False
            yield st
