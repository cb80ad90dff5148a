"""Dashboard charts: plain functions of a results DataFrame (the store's `results_dataframe`) -> Plotly figures.

Nothing here touches the store, the engine or Gradio, so every function is unit-testable on a hand-made
DataFrame. Speed-up is always measured inside one run against that run's `ar` rows (Spec-Bench's
formula: mean tokens/s of the strategy / mean tokens/s of ar), never across runs or machines.
"""
from __future__ import annotations

import math
from datetime import date, datetime

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..metrics import percentile, speedup

ENV_COLUMNS = ("model", "device", "dtype")


def _empty(title: str, why: str = "no results match the filters") -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=title, xaxis={"visible": False}, yaxis={"visible": False}, height=360,
                      annotations=[{"text": why, "showarrow": False, "font": {"size": 14}}])
    return fig


def _num(s: pd.Series) -> pd.Series:
    return pd.to_numeric(s, errors="coerce")


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    """Rows without an error."""
    if df is None or len(df) == 0:
        return pd.DataFrame() if df is None else df
    return df[df["error"].isna()] if "error" in df else df


def parse_since(since) -> date | None:
    """'YYYY-MM-DD' (or a date/datetime/epoch seconds) -> date; '' -> None; anything else -> ValueError."""
    if since in (None, ""):
        return None
    if isinstance(since, datetime):
        return since.date()
    if isinstance(since, date):
        return since
    if isinstance(since, (int, float)):
        return datetime.fromtimestamp(float(since)).date()
    try:
        return datetime.strptime(str(since).strip(), "%Y-%m-%d").date()
    except ValueError:
        raise ValueError(f"the date {since!r} is not YYYY-MM-DD") from None


def filter_results(df: pd.DataFrame, runs=None, model: str | None = None, strategies=None, categories=None,
                   since=None) -> pd.DataFrame:
    """Keep the rows of the given runs / model / strategies / categories, created on or after `since`.

    Empty selections mean "all". `ar` rows are kept whenever any strategy of their run is kept, because every
    speed-up and quality figure is measured against them; `strategy_shown` marks the rows the user picked.
    """
    if df is None or len(df) == 0:
        return pd.DataFrame() if df is None else df.copy()
    out = df
    if runs:
        out = out[out["run_id"].isin([int(r) for r in runs])]
    if model and model != "all":
        out = out[out["model"] == model]
    if categories:
        out = out[out["category"].isin(list(categories))]
    d = parse_since(since)
    if d is not None:
        created = pd.to_datetime(out["run_created_at"], utc=True, errors="coerce")
        out = out[created.dt.date >= d]
    out = out.copy()
    out["strategy_shown"] = True
    if strategies:
        chosen = set(strategies)
        out["strategy_shown"] = out["strategy"].isin(chosen)
        out = out[out["strategy_shown"] | (out["strategy"] == "ar")]
    return out


def env_warning(df: pd.DataFrame) -> str | None:
    """A warning when the compared runs differ in model, device or dtype (their figures are not comparable)."""
    if df is None or len(df) == 0 or "run_id" not in df:
        return None
    runs = df.drop_duplicates("run_id")
    if runs["run_id"].nunique() < 2:
        return None
    diffs = []
    for col in ENV_COLUMNS:
        if col in runs:
            vals = sorted({str(v) for v in runs[col].fillna("")})
            if len(vals) > 1:
                diffs.append(f"{col} ({', '.join(v or '?' for v in vals)})")
    if not diffs:
        return None
    return ("The compared runs differ in " + "; ".join(diffs) +
            ": their speeds are not comparable. Each speed-up is still measured within its own run.")


def speedup_table(df: pd.DataFrame) -> pd.DataFrame:
    """Speed-up vs ar per (run, category, strategy) and for 'all' categories; columns run_id, category,
    strategy, speedup, n."""
    df = _ok(df)
    rows = []
    if len(df) == 0:
        return pd.DataFrame(columns=["run_id", "category", "strategy", "speedup", "n"])
    for run_id, d_run in df.groupby("run_id"):
        for cat, d in list(d_run.groupby("category")) + ([("all", d_run)] if d_run["category"].nunique() > 1 else []):
            ar = _num(d.loc[d["strategy"] == "ar", "tokens_per_s"]).dropna().tolist()
            for s, ds in d.groupby("strategy"):
                if s == "ar" or ("strategy_shown" in ds and not ds["strategy_shown"].any()):
                    continue
                sp = speedup(_num(ds["tokens_per_s"]).dropna().tolist(), ar)
                if sp is not None:
                    rows.append({"run_id": int(run_id), "category": str(cat), "strategy": s, "speedup": sp,
                                 "n": len(ds)})
    return pd.DataFrame(rows, columns=["run_id", "category", "strategy", "speedup", "n"])


def speedup_bar(df: pd.DataFrame) -> go.Figure:
    """Bars: speed-up vs ar by strategy (x) and category (colour), averaged over the selected runs."""
    title = "Speed-up vs ar by strategy and category"
    t = speedup_table(df)
    if len(t) == 0:
        return _empty(title, "no speed-up to show: select runs that include `ar` and another strategy")
    g = t.groupby(["category", "strategy"]).agg(speedup=("speedup", "mean"), n=("n", "sum"),
                                                runs=("run_id", "nunique")).reset_index()
    fig = go.Figure()
    for cat, d in g.groupby("category", sort=True):
        fig.add_bar(x=d["strategy"], y=d["speedup"], name=str(cat),
                    text=[f"{v:.2f}×" for v in d["speedup"]], textposition="outside",
                    customdata=list(zip(d["n"], d["runs"])),
                    hovertemplate="%{x} · " + str(cat) + "<br>speed-up %{y:.2f}×<br>n=%{customdata[0]} "
                                  "results in %{customdata[1]} run(s)<extra></extra>")
    fig.add_hline(y=1.0, line_dash="dot", annotation_text="ar = 1.0×")
    fig.update_layout(title=title, barmode="group", yaxis_title="speed-up (×)", legend_title="category",
                      height=400)
    return fig


def _stats_label(name: str, values: list[float], unit_scale: float = 1000.0, unit: str = "ms") -> str:
    p = [percentile(values, q) for q in (50, 90, 99)]
    return (f"{name}<br>n={len(values)} p50={p[0] * unit_scale:.1f} p90={p[1] * unit_scale:.1f} "
            f"p99={p[2] * unit_scale:.1f} {unit}") if values else f"{name}<br>n=0"


def latency_stats(df: pd.DataFrame) -> pd.DataFrame:
    """p50/p90/p99 and n of TTFT, TPOT and ITL (seconds) per strategy."""
    df = _ok(df)
    rows = []
    for s, d in (df.groupby("strategy") if len(df) else []):
        for metric, vals in (("ttft_s", _num(d["ttft_s"]).dropna().tolist()),
                             ("tpot_s", _num(d["tpot_s"]).dropna().tolist()),
                             ("itl_s", _itl_values(d))):
            rows.append({"strategy": s, "metric": metric, "n": len(vals), "p50": percentile(vals, 50),
                         "p90": percentile(vals, 90), "p99": percentile(vals, 99)})
    return pd.DataFrame(rows, columns=["strategy", "metric", "n", "p50", "p90", "p99"])


def _itl_values(d: pd.DataFrame) -> list[float]:
    if "itl" not in d:
        return []
    out: list[float] = []
    for v in d["itl"]:
        if isinstance(v, (list, tuple)):
            out.extend(float(x) for x in v if x is not None and not math.isnan(float(x)))
    return out


def latency_box(df: pd.DataFrame) -> go.Figure:
    """Box plots of TTFT, TPOT and ITL per strategy; each box's label carries its n, p50, p90 and p99 (ms)."""
    title = "Latency distributions (ms): TTFT · TPOT · ITL"
    df = _ok(df)
    if len(df) == 0:
        return _empty(title)
    fig = make_subplots(rows=1, cols=3, subplot_titles=("TTFT (ms)", "TPOT (ms)", "ITL (ms, per token)"))
    any_data = False
    for s, d in df.groupby("strategy", sort=True):
        series = [_num(d["ttft_s"]).dropna().tolist(), _num(d["tpot_s"]).dropna().tolist(), _itl_values(d)]
        for col, vals in enumerate(series, 1):
            if not vals:
                continue
            any_data = True
            label = _stats_label(str(s), vals)
            fig.add_trace(go.Box(y=[v * 1000 for v in vals], name=label, boxpoints=False, showlegend=False,
                                 legendgroup=str(s)), row=1, col=col)
    if not any_data:
        return _empty(title, "no latency figures in the selected rows")
    fig.update_layout(title=title, height=460, margin={"b": 120})
    fig.update_xaxes(tickfont={"size": 9})
    return fig


def paired_speedups(df: pd.DataFrame) -> pd.DataFrame:
    """Per result of a non-ar strategy: its tokens/s over ar's tokens/s for the same run, item, repeat and
    turn, beside its ROUGE-L vs ar. Columns run_id, item_key, strategy, speedup, rouge_l_vs_ar."""
    cols = ["run_id", "item_key", "strategy", "speedup", "rouge_l_vs_ar"]
    df = _ok(df)
    if len(df) == 0 or "tokens_per_s" not in df:
        return pd.DataFrame(columns=cols)
    keys = ["run_id", "item_key", "repeat", "turn"]
    ar = df[df["strategy"] == "ar"][keys + ["tokens_per_s"]].rename(columns={"tokens_per_s": "ar_tps"})
    other = df[df["strategy"] != "ar"]
    if "strategy_shown" in other:
        other = other[other["strategy_shown"]]
    m = other.merge(ar, on=keys, how="inner")
    if len(m) == 0:
        return pd.DataFrame(columns=cols)
    m["speedup"] = _num(m["tokens_per_s"]) / _num(m["ar_tps"])
    if "q_rouge_l_vs_ar" in m:
        m["rouge_l_vs_ar"] = _num(m["q_rouge_l_vs_ar"])
    elif "quality" in m:
        m["rouge_l_vs_ar"] = [(q or {}).get("rouge_l_vs_ar") if isinstance(q, dict) else None for q in m["quality"]]
        m["rouge_l_vs_ar"] = _num(m["rouge_l_vs_ar"])
    else:
        m["rouge_l_vs_ar"] = float("nan")
    return m[cols].dropna(subset=["speedup", "rouge_l_vs_ar"]).reset_index(drop=True)


def quality_scatter(df: pd.DataFrame) -> go.Figure:
    """Quality (ROUGE-L vs ar) against speed-up vs ar, one point per result, one colour per strategy."""
    title = "Quality vs speed: ROUGE-L vs ar against speed-up vs ar"
    p = paired_speedups(df)
    if len(p) == 0:
        return _empty(title, "no paired results: a run needs `ar` and another strategy on the same prompts")
    fig = go.Figure()
    for s, d in p.groupby("strategy", sort=True):
        fig.add_scatter(x=d["speedup"], y=d["rouge_l_vs_ar"], mode="markers", name=f"{s} (n={len(d)})",
                        customdata=list(zip(d["run_id"], d["item_key"])),
                        hovertemplate=f"{s}<br>speed-up %{{x:.2f}}×<br>ROUGE-L %{{y:.3f}}<br>run %{{customdata[0]}}"
                                      " · %{customdata[1]}<extra></extra>")
    fig.add_vline(x=1.0, line_dash="dot")
    fig.update_layout(title=title, xaxis_title="speed-up vs ar (×)", yaxis_title="ROUGE-L vs ar",
                      yaxis_range=[-0.05, 1.05], height=400)
    return fig


def tokens_per_pass_hist(df: pd.DataFrame) -> go.Figure:
    """Histogram of tokens per target forward pass (tau), one overlaid series per strategy."""
    title = "Tokens per forward pass (τ)"
    df = _ok(df)
    if len(df) == 0:
        return _empty(title)
    if "strategy_shown" in df:
        df = df[df["strategy_shown"] | (df["strategy"] == "ar")]
    fig = go.Figure()
    for s, d in df.groupby("strategy", sort=True):
        vals = _num(d["tokens_per_pass"]).dropna()
        if len(vals):
            fig.add_histogram(x=vals, name=f"{s} (n={len(vals)}, mean {vals.mean():.2f})", opacity=0.65,
                              nbinsx=30)
    if not fig.data:
        return _empty(title, "no tokens-per-pass figures in the selected rows")
    fig.update_layout(title=title, barmode="overlay", xaxis_title="tokens per forward pass",
                      yaxis_title="results", height=400)
    return fig


def runs_table(runs: list[dict]) -> pd.DataFrame:
    """The run history (from `Store.list_runs`) as a display table."""
    cols = ["id", "created", "kind", "status", "name", "model", "device", "dtype", "strategies", "results"]
    rows = []
    for r in runs:
        created = r.get("created_at")
        rows.append({"id": r["id"], "created": created.strftime("%Y-%m-%d %H:%M:%S") if created else "",
                     "kind": r.get("kind", ""), "status": r.get("status", ""), "name": r.get("name", ""),
                     "model": r.get("model", ""), "device": r.get("device", ""), "dtype": r.get("dtype", ""),
                     "strategies": ", ".join(map(str, r.get("strategies") or [])),
                     "results": r.get("n_results", 0)})
    return pd.DataFrame(rows, columns=cols)


EXPORT_DROP = ("strategy_shown",)


def export_frame(df: pd.DataFrame) -> pd.DataFrame:
    """The filtered rows as they go into the CSV export (lists and dicts as JSON text)."""
    import json
    if df is None or len(df) == 0:
        return pd.DataFrame()
    out = df.drop(columns=[c for c in EXPORT_DROP if c in df])
    for c in out.columns:
        if out[c].map(lambda v: isinstance(v, (list, dict))).any():
            out[c] = out[c].map(lambda v: json.dumps(v) if isinstance(v, (list, dict)) else v)
    return out
