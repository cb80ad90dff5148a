"""Output-quality metrics, all offline (no `evaluate` package, nothing downloaded).

* `rouge_l(candidate, reference)` - ROUGE-L F1 in [0, 1] (rouge_score's LCS scorer, no stemming). Tokens are
  lower-cased runs of letters/digits of any script - the same as rouge_score's own tokenizer on ASCII text,
  but non-Latin text is not thrown away.
* `bleu(candidate, reference)` - sacrebleu sentence BLEU, 0..100 (13a tokenizer, exponential smoothing).
* `exact_match(ids, ref_ids)` - True when the token ids are identical, else False.
* `first_divergence(ids, ref_ids)` - the index of the first differing token (None when identical).
* `perplexity(engine, prompt_ids, output_ids)` - exp(mean NLL of the output tokens given the prompt),
  from one forward pass of the engine's model.
* `divergence_margin(engine, prompt_ids, ar_ids, other_ids, at)` - at a lossless strategy's first differing
  token, the model's logit of ar's token minus that of the other's (one forward pass): rounding at a near-tie,
  or a real disagreement.
* `point_coverage(candidate, reference)` - the share of the reference's list points (numbered or bulleted
  lines) that the candidate covers: a reference point counts as covered when at least half of its heading's
  content words (5-letter stems) occur in one of the candidate's points. None unless the reference has at
  least two points. It is how SoT's answer is compared with `ar`'s beside ROUGE-L (SoT's points are short).
* `code_checks(text, tests)` - for code answers: `code_parses` (the answer's first Python code block, or the
  whole answer without one, is valid Python by `ast.parse`) and, where the item has checks, `passes_tests`
  (that code followed by the checks exits 0 in a separate, isolated `python -I` process within 10 s).
* `quality_row(...)` - the comparisons stored in results.quality (the schema below); `normalise(q)` reads a
  quality dict stored by an older paradec in that schema.

The stored schema (results.quality), one for every producer (bench, the Arena, the long-context eval, through
`paradec.bench.result_row`):
  exact_match          bool: the answer's token ids equal ar's (on text when token ids are not comparable:
                       a remote engine's); absent without an ar answer to compare with
  diverges_at          index of the first token that differs from ar's, None when identical; present
                       whenever exact_match compares token ids
  rouge_l_vs_ar, bleu_vs_ar, point_coverage_vs_ar, rouge_l_vs_ref, bleu_vs_ref, contains_ref   (see above)
  divergence           {at, logit_margin, p_ar, p_other} where a lossless strategy's answer differs from
                       ar's (in-process engines only)
  perplexity, lossless_strategy, status, finish_reason, and a task's own scores (e.g. `correct`, or
  `code_parses` / `passes_tests` for a code item): added by the row builder

Metrics that have nothing to compare return None (no reference, empty output for perplexity).

A reference may be one text or a list of acceptable texts (Spec-Bench gives some turns several): ROUGE-L is the
best over the alternatives, BLEU is taken against that best-matching alternative (the highest ROUGE-L; the first
on a tie), and `contains` holds when any alternative occurs in the candidate.
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from functools import lru_cache

_WORD = re.compile(r"[^\W_]+")


class _Tokenizer:
    """Lower-cased letter/digit runs (Unicode-aware); punctuation and underscores separate tokens."""

    @staticmethod
    def tokenize(text: str) -> list[str]:
        return _WORD.findall(text.lower())


@lru_cache(maxsize=1)
def _scorer():
    from rouge_score import rouge_scorer
    return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False, tokenizer=_Tokenizer())


Reference = str | Sequence[str] | None      # one text, or the acceptable alternatives


def alternatives(reference: Reference) -> list[str]:
    """The reference as a list of acceptable texts (empty without one)."""
    if reference is None:
        return []
    if isinstance(reference, str):
        return [reference]
    return [r for r in reference if isinstance(r, str)]


def _rouge_one(candidate: str, reference: str) -> float:
    if not _Tokenizer.tokenize(candidate) and not _Tokenizer.tokenize(reference):
        return float(candidate.strip() == reference.strip())
    return float(_scorer().score(reference, candidate)["rougeL"].fmeasure)


def best_reference(candidate: str | None, reference: Reference) -> str | None:
    """The alternative with the highest ROUGE-L against candidate (the first on a tie); None without one."""
    alts = alternatives(reference)
    if candidate is None or not alts:
        return None
    if len(alts) == 1:
        return alts[0]
    scores = [_rouge_one(candidate, a) for a in alts]
    return alts[scores.index(max(scores))]


def rouge_l(candidate: str | None, reference: Reference) -> float | None:
    """ROUGE-L F1 of candidate against reference (the best over its alternatives), in [0, 1]; None without one."""
    alts = alternatives(reference)
    if candidate is None or not alts:
        return None
    return max(_rouge_one(candidate, a) for a in alts)


def bleu(candidate: str | None, reference: Reference) -> float | None:
    """Sentence BLEU (sacrebleu), 0..100, against the best-matching alternative; None without a reference."""
    reference = best_reference(candidate, reference)
    if reference is None or candidate is None:
        return None
    if not candidate.strip() or not reference.strip():
        return 100.0 if candidate.strip() == reference.strip() else 0.0
    import sacrebleu
    return float(sacrebleu.sentence_bleu(candidate, [reference]).score)


def exact_match(ids, ref_ids) -> bool | None:
    """True if the two token-id sequences are identical, False if not; None without a reference."""
    if ref_ids is None or ids is None:
        return None
    return list(ids) == list(ref_ids)


def first_divergence(ids, ref_ids) -> int | None:
    """Index of the first differing token (or the shorter length when one is a prefix); None if identical."""
    a, b = list(ids), list(ref_ids)
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def contains(candidate: str | None, reference: Reference) -> float | None:
    """1.0 if the reference text (any alternative) occurs in the candidate (passkey retrieval, short answers)."""
    alts = [a.strip() for a in alternatives(reference) if a.strip()]
    if candidate is None or not alts:
        return None
    return float(any(a in candidate for a in alts))


def divergence_margin(engine, prompt_ids, ar_ids, other_ids, at: int) -> dict | None:
    """Where a lossless strategy's greedy output first differs from ar's (index `at`), how close the model's
    choice was: one forward pass over the prompt and ar's first `at` tokens, then the logit of ar's token minus
    the logit of the other's, and both probabilities. A margin of a rounding step or two (bf16 keeps 8
    significant bits: 0.125 at a logit of 16-32) says the pass width changed the rounding at a near-tie - a
    multi-token verification pass computes some of its sums in another order than ar's one-token pass (the
    packed linears are row-independent, so attention is the likely place; not pinned down) - not that the
    strategy picked a token the model did not prefer. None when there is no such position."""
    import torch

    if at is None or at >= min(len(ar_ids), len(other_ids)):
        return None
    ids = [int(t) for t in prompt_ids] + [int(t) for t in ar_ids[:at]]
    ctx = int(getattr(engine, "context_length", 0) or 0)
    if ctx and len(ids) > ctx:
        ids = ids[-ctx:]
    logits = engine.forward(ids, logits_to_keep=1)[0, -1].float()
    p = torch.softmax(logits, -1)
    a, o = int(ar_ids[at]), int(other_ids[at])
    return {"at": at, "logit_margin": float(logits[a] - logits[o]), "p_ar": float(p[a]), "p_other": float(p[o])}


def perplexity(engine, prompt_ids, output_ids) -> float | None:
    """exp(mean negative log-likelihood of output_ids given prompt_ids) under engine's model; one forward pass.

    Returns None for an empty output (or a lone token with no prompt to condition on). When prompt+output
    exceed the model's context, the prompt is cut from the left; output tokens beyond the context are
    scored on the last context window only.
    """
    import torch

    prompt, out = [int(t) for t in prompt_ids], [int(t) for t in output_ids]
    if not out:
        return None
    if not prompt:                      # nothing conditions the first token: score the rest given it
        prompt, out = out[:1], out[1:]
        if not out:
            return None
    ctx = int(getattr(engine, "context_length", 0) or 0)
    ids = prompt + out
    if ctx and len(ids) > ctx:
        ids = ids[-ctx:]
        out = out[-(ctx - 1):] if len(out) >= ctx else out
    n = len(out)
    logits = engine.forward(ids, logits_to_keep=n + 1)[0, :-1]        # positions predicting each output token
    logp = torch.log_softmax(logits.float(), dim=-1)
    target = torch.tensor(out, device=logp.device)
    nll = -logp.gather(1, target[:, None]).squeeze(1).double().mean().item()
    if not math.isfinite(nll):
        return float("inf")
    return math.exp(nll) if nll < 700 else float("inf")


_LIST_LINE = re.compile(r"^\s*(?:\d{1,3}\s*[.)]|[-*\u2022])\s+(.*\S)\s*$")
_STOP = frozenset("""a an and are as at be by can for from has have how in is it its of on or that the their them
this to use using was what when which who why will with you your more less not very""".split())


def list_points(text: str | None) -> list[str]:
    """The list items of a text: lines that start with `N.`, `N)`, `-`, `*` or a bullet, markdown stripped."""
    if not text:
        return []
    return [m.group(1).replace("**", "").replace("__", "").strip()
            for m in map(_LIST_LINE.match, text.splitlines()) if m]


def _heading(point: str) -> str:
    """A point's heading: the text before its first ':' / ' - ' (the whole point when it has neither)."""
    for sep in (":", " - ", " \u2013 "):
        if sep in point:
            return point.split(sep, 1)[0]
    return point


def content_stems(text: str) -> set[str]:
    return {w[:5] for w in _WORD.findall(text.lower()) if w.isdigit() or (w not in _STOP and len(w) > 2)}


def point_coverage(candidate: str | None, reference: str | None) -> float | None:
    """Share of the reference's points (>= 2 needed) that some point of the candidate covers (see module doc)."""
    ref = [s for s in (content_stems(_heading(p)) for p in list_points(reference)) if s]
    if len(ref) < 2:
        return None
    cand = [content_stems(p) for p in list_points(candidate)] or [content_stems(candidate or "")]
    covered = sum(any(len(r & c) * 2 >= len(r) for c in cand) for r in ref)
    return covered / len(ref)


_FENCE = re.compile(r"```[ \t]*(python|py|python3)?[ \t]*\n(.*?)(?:```|\Z)", re.S | re.I)
CODE_CATEGORIES = ("code", "code-edit")


def code_of(text: str | None) -> str:
    """The answer's first Python code block (an unclosed block runs to the end), else any first block, else
    the whole text."""
    text = text or ""
    blocks = _FENCE.findall(text)
    for lang, body in blocks:
        if lang:
            return body
    return blocks[0][1] if blocks else text


def code_checks(text: str | None, tests: str | None = None, timeout: float = 10.0) -> dict:
    """{"code_parses": bool} plus {"passes_tests": bool} when `tests` (Python assertions) are given."""
    import ast
    import subprocess
    import sys
    import tempfile
    code = code_of(text)
    try:
        ast.parse(code)
        ok = bool(code.strip())
    except (SyntaxError, ValueError):
        ok = False
    out = {"code_parses": ok}
    if tests:
        if not ok:
            out["passes_tests"] = False
            return out
        with tempfile.TemporaryDirectory() as d:
            try:
                r = subprocess.run([sys.executable, "-I", "-c", code + "\n\n" + tests], cwd=d, timeout=timeout,
                                   capture_output=True, stdin=subprocess.DEVNULL, env={"PATH": "/usr/bin:/bin"})
                out["passes_tests"] = r.returncode == 0
            except subprocess.TimeoutExpired:
                out["passes_tests"] = False
    return out


def quality_row(text: str, token_ids=None, *, ar_text: str | None = None, ar_ids=None,
                reference: Reference = None, text_only: bool = False) -> dict:
    """The comparisons stored with a result (the schema in the module doc): agreement with autoregressive
    output and with the reference (the best-matching alternative where there are several). `text_only`: the
    token ids are not comparable (a remote engine's placeholders), so exact_match compares text and there is
    no diverges_at. Keys whose comparison is missing are left out."""
    q: dict = {}
    if ar_text is not None and text_only:
        q["exact_match"] = text == ar_text
    elif token_ids is not None and ar_ids is not None:
        q["exact_match"] = exact_match(token_ids, ar_ids)
        q["diverges_at"] = first_divergence(token_ids, ar_ids)          # None when identical: kept
    more = {"rouge_l_vs_ar": rouge_l(text, ar_text), "point_coverage_vs_ar": point_coverage(text, ar_text),
            "bleu_vs_ar": bleu(text, ar_text), "rouge_l_vs_ref": rouge_l(text, reference),
            "bleu_vs_ref": bleu(text, reference), "contains_ref": contains(text, reference)}
    return q | {k: v for k, v in more.items() if v is not None}


def normalise(q: dict | None) -> dict | None:
    """A stored quality dict in the schema of the module doc, whichever paradec wrote it: an older Arena row
    also kept the divergence as `first_mismatch` (dropped: `diverges_at` holds it), and an exact_match of
    1.0 / 0.0 (the old `quality_row`) becomes a bool with its `diverges_at`. Read by the store, once."""
    if not q or not ("first_mismatch" in q or isinstance(q.get("exact_match"), float)):
        return q
    q = dict(q)
    first = q.pop("first_mismatch", None)          # kept by quality_row on a mismatch only
    was_float = isinstance(q.get("exact_match"), float)
    if was_float:
        q["exact_match"] = q["exact_match"] == 1.0
    if was_float or first is not None:
        q.setdefault("diverges_at", first)
    return q
