"""Output-quality metrics, all offline (no `evaluate` package, nothing downloaded).

* `rouge_l(candidate, reference)` - ROUGE-L F1 in [0, 1] (rouge_score's LCS scorer, no stemming). Tokens are
  lower-cased runs of letters/digits of any script - the same as rouge_score's own tokenizer on ASCII text,
  but non-Latin text is not thrown away.
* `bleu(candidate, reference)` - sacrebleu sentence BLEU, 0..100 (13a tokenizer, exponential smoothing).
* `exact_match(ids, ref_ids)` - 1.0 when the token ids are identical, else 0.0.
* `perplexity(engine, prompt_ids, output_ids)` - exp(mean NLL of the output tokens given the prompt),
  from one forward pass of the engine's model.
* `quality_row(...)` - the dict stored in results.quality.

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


def exact_match(ids, ref_ids) -> float | None:
    """1.0 if the two token-id sequences are identical, 0.0 if not; None without a reference."""
    if ref_ids is None or ids is None:
        return None
    return float(list(ids) == list(ref_ids))


def first_mismatch(ids, ref_ids) -> int | None:
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


def quality_row(text: str, token_ids=None, *, ar_text: str | None = None, ar_ids=None,
                reference: Reference = None) -> dict:
    """The quality dict stored with a result: agreement with autoregressive output and with the reference (the
    best-matching alternative where there are several). Keys whose comparison is missing are left out."""
    q = {"exact_match": exact_match(token_ids, ar_ids) if token_ids is not None else None,
         "rouge_l_vs_ar": rouge_l(text, ar_text), "bleu_vs_ar": bleu(text, ar_text),
         "rouge_l_vs_ref": rouge_l(text, reference), "bleu_vs_ref": bleu(text, reference),
         "contains_ref": contains(text, reference)}
    if token_ids is not None and ar_ids is not None and q["exact_match"] == 0.0:
        q["first_mismatch"] = first_mismatch(token_ids, ar_ids)
    return {k: v for k, v in q.items() if v is not None}
