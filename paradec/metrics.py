"""Latency and throughput figures from timed steps, with the exact meanings of ALGORITHMS.md.

A strategy's clock is its own compute time: the sum of its timed steps (device synchronised before and
after each), so figures mean "what it would take alone" also when several strategies share the engine.
  TTFT  request start -> first token (prefill included)
  E2E   request start -> last step
  TPOT  (E2E - TTFT) / (n - 1)
  ITL   gap between token arrivals divided by the tokens that arrived together
  tau   tokens per forward pass: generated tokens / target forward passes (prefill pass included, so ar = 1.00)
Tokens of planning steps (SoT's skeleton) cost time and passes but are not answer tokens: they are not
counted in tokens, TTFT or ITL.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class TimedStep:
    t_end: float            # strategy clock at the end of the step (seconds of own compute)
    dt: float               # duration of the step
    n_tokens: int
    segment: int = 0
    forward_passes: int = 0
    draft_passes: int = 0
    drafted: int = 0
    accepted: int = 0
    planning: bool = False  # tokens that are not part of the answer (SoT's skeleton): timed, not counted
    draft_s: float = 0.0    # of dt, the seconds a draft-and-verify strategy spent drafting (its Step.info)


@dataclass
class Figures:
    tokens: int = 0
    elapsed_s: float = 0.0
    ttft_s: float | None = None
    tokens_per_s: float | None = None
    tpot_s: float | None = None
    forward_passes: int = 0
    draft_passes: int = 0
    drafted: int = 0
    accepted: int = 0
    tokens_per_pass: float | None = None
    acceptance: float | None = None
    itl: list[float] = field(default_factory=list)

    def as_dict(self, with_itl: bool = False) -> dict:
        d = {k: getattr(self, k) for k in ("tokens", "elapsed_s", "ttft_s", "tokens_per_s", "tpot_s",
                                           "forward_passes", "draft_passes", "drafted", "accepted",
                                           "tokens_per_pass", "acceptance")}
        if with_itl:
            d["itl"] = self.itl
        return d


def figures(steps: list[TimedStep]) -> Figures:
    f = Figures()
    last_arrival = None
    for s in steps:
        f.forward_passes += s.forward_passes
        f.draft_passes += s.draft_passes
        f.drafted += s.drafted
        f.accepted += s.accepted
        f.elapsed_s = s.t_end
        if s.n_tokens <= 0 or s.planning:
            continue
        if f.ttft_s is None:
            f.ttft_s = s.t_end
            if s.n_tokens > 1:       # tokens that arrived with the first one: their gap is 0 for the first token
                f.itl.extend([0.0] * (s.n_tokens - 1))
        else:
            gap = (s.t_end - last_arrival) / s.n_tokens
            f.itl.extend([gap] * s.n_tokens)
        last_arrival = s.t_end
        f.tokens += s.n_tokens
    if f.tokens and f.elapsed_s > 0:
        f.tokens_per_s = f.tokens / f.elapsed_s
    if f.tokens > 1 and f.ttft_s is not None:
        f.tpot_s = (f.elapsed_s - f.ttft_s) / (f.tokens - 1)
    if f.forward_passes:
        f.tokens_per_pass = f.tokens / f.forward_passes
    if f.drafted:
        f.acceptance = f.accepted / f.drafted
    return f


def percentile(values: list[float], q: float) -> float | None:
    vals = sorted(v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v)))
    if not vals:
        return None
    k = (len(vals) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return vals[lo] + (vals[hi] - vals[lo]) * (k - lo)


def summary(values: list[float]) -> dict:
    vals = [v for v in values if v is not None]
    return {"n": len(vals), "mean": sum(vals) / len(vals) if vals else None,
            "p50": percentile(vals, 50), "p90": percentile(vals, 90), "p99": percentile(vals, 99)}


def speedup(strategy_tps: list[float], ar_tps: list[float]) -> float | None:
    """Mean tokens/s of the strategy / mean tokens/s of ar, same run (Spec-Bench's formula); values that are
    missing, NaN or 0 are left out of both means. None when either side has no value. The one speed-up of
    paradec: bench's table and Markdown, the Dashboard's charts and the Eval sets tab all take it (also for
    end-to-end speed-up: speedup(ar E2E seconds, strategy E2E seconds))."""
    s = [v for v in strategy_tps if v and v == v]
    a = [v for v in ar_tps if v and v == v]
    if not s or not a:
        return None
    return (sum(s) / len(s)) / (sum(a) / len(a))


ALL = "all"


def by_category(df):
    """(run id, category, rows) of a results DataFrame, run by run: each category of the run (sorted), then
    ALL. The one rule for 'all': every run has it, holding every row of the run (all its categories pooled;
    a run of one category repeats that category's figures there). Speed-ups are only ever taken inside one
    (run, category) group against its own `ar` rows, never across runs or machines."""
    for run_id in sorted(df["run_id"].unique()):
        d_run = df[df["run_id"] == run_id]
        for cat in sorted(d_run["category"].dropna().unique().tolist()) + [ALL]:
            yield run_id, cat, d_run if cat == ALL else d_run[d_run["category"] == cat]
