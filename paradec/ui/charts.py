"""Dashboard charts: plain functions of a results DataFrame (the store's `results_dataframe`) -> Plotly figures.

Nothing here touches the store, the engine or Gradio, so every function is unit-testable on a hand-made
DataFrame. Speed-up is always measured inside one run against that run's `ar` rows (Spec-Bench's
formula: mean tokens/s of the strategy / mean tokens/s of ar: `paradec.metrics.speedup`), never across runs or
machines, per category and for 'all' by the one rule of `paradec.metrics.by_category`.
"""
from __future__ import annotations

import math
from datetime import date, datetime

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..metrics import by_category, percentile, speedup

ENV_COLUMNS = ("model", "device", "dtype")

# one colour per strategy in every chart and in the Arena (registry order; unknown names get a stable pick)
STRATEGY_COLOURS = {
    "ar": "#4c4c4c", "hf-generate": "#9e9e9e", "hf-assisted": "#b39ddb", "hf-pld": "#80cbc4", "sps": "#1f77b4",
    "pld": "#2ca02c", "lookahead": "#ff7f0e", "sot": "#d62728", "sot-r": "#e377c2", "sot-seq": "#8c564b",
    "ptp": "#9467bd", "lud": "#17becf", "lud-verified": "#0e7c8a", "pcw": "#bcbd22", "focus": "#7f7f00",
    "ar-truncated": "#aaaaaa", "ape": "#dbdb8d", "eagle": "#003f8a", "ar-full": "#000000", "vllm-spec": "#00695c"}
_EXTRA = ("#636EFA", "#EF553B", "#00CC96", "#AB63FA", "#FFA15A", "#19D3F3", "#FF6692", "#B6E880")


def strategy_colour(name) -> str:
    name = str(name)
    if name in STRATEGY_COLOURS:
        return STRATEGY_COLOURS[name]
    return _EXTRA[sum(map(ord, name)) % len(_EXTRA)]


def wrap_text(text: str, width: int = 56) -> str:
    """Plain text -> lines of at most `width` characters joined by <br> (Plotly does not wrap annotations)."""
    lines, cur = [], ""
    for word in str(text).split():
        if cur and len(cur) + 1 + len(word) > width:
            lines.append(cur)
            cur = word
        else:
            cur = f"{cur} {word}" if cur else word
    if cur:
        lines.append(cur)
    return "<br>".join(lines)


def _empty(title: str, why: str = "no results match the filters") -> go.Figure:
    """A figure that says why it is empty, in a box the text fits (wrapped, centred, no axes)."""
    fig = go.Figure()
    fig.update_layout(title={"text": title, "font": {"size": 15}}, xaxis={"visible": False},
                      yaxis={"visible": False}, height=300, margin={"l": 20, "r": 20, "t": 60, "b": 20},
                      plot_bgcolor="rgba(0,0,0,0)",
                      annotations=[{"text": wrap_text(why, 56), "showarrow": False, "font": {"size": 13},
                                    "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5, "align": "center"}])
    return fig


def _legend_below() -> dict:
    return {"orientation": "h", "yanchor": "top", "y": -0.18, "xanchor": "left", "x": 0}


# ------------------------------------------------------------------------------------- number formatting
def _is_nan(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def fmt_number(v, kind: str = "float") -> str:
    """A value for reading: kind 'speedup' 1.23×, 'ms' (value in seconds) 12.3 ms, 's' 1.23 s, 'int' 12,
    'rate' 12.3, 'ratio' 0.889, 'float' at most 4 decimals; '–' for nothing."""
    if _is_nan(v):
        return "–"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        try:
            v = float(v)
        except (TypeError, ValueError):
            return str(v)
    v = float(v)
    if kind == "speedup":
        return f"{v:.2f}×"
    if kind == "ms":
        ms = v * 1000
        return f"{ms:.1f}" if abs(ms) < 1000 else f"{ms:,.0f}"
    if kind == "s":
        return f"{v:.2f}" if abs(v) < 100 else f"{v:,.0f}"
    if kind == "int":
        return f"{round(v):d}"
    if kind == "rate":
        return f"{v:.1f}"
    if kind == "ratio":
        return f"{v:.3f}"
    if kind == "tau":
        return f"{v:.2f}"
    if v == int(v) and abs(v) < 1e15:
        return f"{int(v)}"
    return f"{v:.4f}".rstrip("0").rstrip(".") if abs(v) < 1000 else f"{v:,.1f}"


# the summary table (`paradec.bench.table`): column -> (header, kind)
SUMMARY_COLUMNS = {
    "run": ("run", "int"), "category": ("category", None), "strategy": ("strategy", None), "n": ("n", "int"),
    "speedup": ("speed-up vs ar", "speedup"), "e2e_speedup": ("end-to-end speed-up", "speedup"),
    "tokens_per_s": ("tokens/s", "rate"), "tokens_per_pass": ("tokens per pass", "tau"),
    "forward_passes": ("forward passes (mean)", "rate"), "ttft_p50": ("TTFT p50 (ms)", "ms"),
    "tpot_p50": ("TPOT p50 (ms)", "ms"), "rouge_l_vs_ar": ("ROUGE-L vs ar", "ratio"),
    "rouge_l_vs_ref": ("ROUGE-L vs ref", "ratio"), "perplexity": ("perplexity", "tau"),
    "lossless_mismatches": ("lossless mismatches", "int")}


# display widths of the summary table's columns (px), so headers wrap between words, never inside one
SUMMARY_WIDTHS = [44, 90, 100, 44] + [76] * (len(SUMMARY_COLUMNS) - 6) + [92, 100]


def _kind_for(col: str) -> str | None:
    c = col.lower()
    if "speedup" in c or "speed-up" in c:
        return "speedup"
    if c in ("n", "id", "run", "run_id", "results", "repeat", "turn", "n_tokens", "tokens", "forward_passes",
             "draft_passes", "drafted", "accepted", "turns"):
        return "int"
    if c.endswith("_s") or c.startswith(("ttft", "tpot", "itl")):
        return "ms"
    return "float"


def format_table(rows, columns: dict | None = None) -> pd.DataFrame:
    """Rows (list of dicts or a DataFrame) -> a DataFrame of display strings: numbers rounded for reading
    (speed-ups 2 decimals with ×, times in ms, counts as integers, nothing past 4 decimals), headers from
    `columns` ({column: (header, kind)}; other numeric columns get a kind from their name). The CSV export
    keeps the raw values."""
    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows or []))
    columns = columns or {}
    if len(df) == 0:
        heads = [columns[c][0] for c in columns] if columns else list(df.columns)
        return pd.DataFrame(columns=heads)
    out = {}
    for c in df.columns:
        head, kind = columns.get(c, (c, "auto"))
        vals = df[c]
        if kind == "auto":
            numeric = vals.map(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)).all()
            kind = _kind_for(str(c)) if numeric else None
            if kind == "ms" and not str(head).endswith(")"):
                head = f"{head} (ms)"
        out[head] = [fmt_number(v, kind) if kind else ("" if _is_nan(v) else str(v)) for v in vals]
    return pd.DataFrame(out)


def summary_frame(rows) -> pd.DataFrame:
    """The Dashboard's summary table from `paradec.bench.table` rows, formatted, with readable headers."""
    rows = list(rows or [])
    cols = {c: SUMMARY_COLUMNS[c] for c in SUMMARY_COLUMNS if not rows or c in rows[0]}
    df = pd.DataFrame(rows, columns=list(cols)) if rows else pd.DataFrame(columns=list(cols))
    return format_table(df, cols)


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
    """Speed-up vs ar per (run, category, strategy), 'all' included: the speed-up column of the one summary
    table (`paradec.bench.table`, categories and 'all' by `paradec.metrics.by_category`), for the strategies
    shown other than ar, where there is one; columns run_id, category, strategy, speedup, n."""
    from ..bench import table
    cols = ["run_id", "category", "strategy", "speedup", "n"]
    df = _ok(df)
    if len(df) == 0:
        return pd.DataFrame(columns=cols)
    shown = set(df.loc[df["strategy_shown"].astype(bool), "strategy"]) if "strategy_shown" in df else None
    rows = [{"run_id": r["run"], "category": str(r["category"]), "strategy": r["strategy"], "speedup": r["speedup"],
             "n": r["n"]} for r in table(df)
            if r["strategy"] != "ar" and r["speedup"] is not None and (shown is None or r["strategy"] in shown)]
    return pd.DataFrame(rows, columns=cols)


def speedup_bar(df: pd.DataFrame) -> go.Figure:
    """Bars: speed-up vs ar by category (x) and strategy (colour, the same in every chart), averaged over the
    selected runs."""
    title = "Speed-up vs ar by category and strategy"
    t = speedup_table(df)
    if len(t) == 0:
        return _empty(title, "no speed-up to show: select runs that include `ar` and another strategy")
    g = t.groupby(["category", "strategy"]).agg(speedup=("speedup", "mean"), n=("n", "sum"),
                                                runs=("run_id", "nunique")).reset_index()
    fig = go.Figure()
    for s, d in g.groupby("strategy", sort=True):
        fig.add_bar(x=d["category"], y=d["speedup"], name=str(s), marker_color=strategy_colour(s),
                    text=[f"{v:.2f}×" for v in d["speedup"]], textposition="outside", cliponaxis=False,
                    customdata=list(zip(d["n"], d["runs"])),
                    hovertemplate=str(s) + " · %{x}<br>speed-up %{y:.2f}×<br>n=%{customdata[0]} "
                                  "results in %{customdata[1]} run(s)<extra></extra>")
    top = max(1.0, float(g["speedup"].max()))
    fig.add_hline(y=1.0, line_dash="dot", annotation_text="ar = 1.0×", annotation_position="top left")
    fig.update_layout(title=title, barmode="group", yaxis_title="speed-up (×)", legend_title="strategy",
                      height=420, yaxis_range=[0, top * 1.22], margin={"t": 70},
                      uniformtext={"minsize": 9, "mode": "hide"} if len(g) > 40 else None)
    # horizontal labels while they fit side by side; a slant (never vertical) when there are many categories
    fig.update_xaxes(tickangle=0 if g["category"].nunique() <= 5 else -30, automargin=True)
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
    fig = make_subplots(rows=1, cols=3, subplot_titles=("TTFT (ms)", "TPOT (ms)", "ITL (ms, per token)"),
                        shared_yaxes=True, horizontal_spacing=0.04)
    any_data = False
    for s, d in df.groupby("strategy", sort=True):
        series = [_num(d["ttft_s"]).dropna().tolist(), _num(d["tpot_s"]).dropna().tolist(), _itl_values(d)]
        for col, vals in enumerate(series, 1):
            if not vals:
                continue
            any_data = True
            label = _stats_label(str(s), vals)
            colour = strategy_colour(s)
            # horizontal boxes: the strategies' names stay readable however many there are; n and the
            # percentiles are in the trace name and the hover text
            fig.add_trace(go.Box(y=[str(s)] * len(vals), x=[v * 1000 for v in vals], name=label, boxpoints=False,
                                 orientation="h", showlegend=False, legendgroup=str(s), marker_color=colour,
                                 line_color=colour, hovertemplate=label.replace("<br>", " · ") + "<extra></extra>"),
                          row=1, col=col)
    if not any_data:
        return _empty(title, "no latency figures in the selected rows")
    n = df["strategy"].nunique()
    fig.update_layout(title=title, height=max(320, 130 + 34 * n), margin={"b": 50})
    fig.update_yaxes(automargin=True, tickfont={"size": 11}, autorange="reversed")
    fig.update_xaxes(rangemode="tozero")
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
    m["speedup"] = _num(pd.Series([speedup([a], [b]) for a, b in zip(_num(m["tokens_per_s"]), _num(m["ar_tps"]))],
                                  index=m.index, dtype=object))
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
                        marker={"color": strategy_colour(s), "size": 8 if len(d) < 50 else 5, "opacity": 0.75},
                        customdata=list(zip(d["run_id"], d["item_key"])),
                        hovertemplate=f"{s}<br>speed-up %{{x:.2f}}×<br>ROUGE-L %{{y:.3f}}<br>run %{{customdata[0]}}"
                                      " · %{customdata[1]}<extra></extra>")
    fig.add_vline(x=1.0, line_dash="dot")
    fig.update_layout(title=title, xaxis_title="speed-up vs ar (×)", yaxis_title="ROUGE-L vs ar",
                      yaxis_range=[-0.05, 1.05], height=400)
    return fig


def hist_bins(values) -> dict:
    """Bins fitted to the data: {start, end, size} for Plotly's xbins. Tokens per pass of a single strategy
    are often all 1.00 (ar); then one narrow bin around the value, never a block from 0.8 to 1.2."""
    vals = [float(v) for v in values if not _is_nan(v)]
    if not vals:
        return {"start": 0.0, "end": 1.0, "size": 0.1}
    lo, hi = min(vals), max(vals)
    span = hi - lo
    if span < 1e-9:
        size = 0.05 if abs(lo) < 10 else max(abs(lo) * 0.01, 0.05)
        return {"start": lo - size / 2, "end": lo + size / 2, "size": size}
    n_bins = int(min(40, max(6, math.sqrt(len(vals)) * 2)))
    raw = span / n_bins
    mag = 10 ** math.floor(math.log10(raw))
    size = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / size) * size
    return {"start": start, "end": start + size * (math.floor((hi - start) / size + 1e-9) + 1), "size": size}


def tokens_per_pass_hist(df: pd.DataFrame) -> go.Figure:
    """Histogram of tokens per target forward pass (tau), one overlaid series per strategy, binned to the data."""
    title = "Tokens per forward pass (τ)"
    df = _ok(df)
    if len(df) == 0:
        return _empty(title)
    if "strategy_shown" in df:
        df = df[df["strategy_shown"] | (df["strategy"] == "ar")]
    all_vals = _num(df["tokens_per_pass"]).dropna() if "tokens_per_pass" in df else pd.Series(dtype=float)
    if not len(all_vals):
        return _empty(title, "no tokens-per-pass figures in the selected rows")
    bins = hist_bins(all_vals.tolist())
    fig = go.Figure()
    for s, d in df.groupby("strategy", sort=True):
        vals = _num(d["tokens_per_pass"]).dropna()
        if len(vals):
            fig.add_histogram(x=vals, name=f"{s} (n={len(vals)}, mean {vals.mean():.2f})", opacity=0.7,
                              xbins=bins, marker_color=strategy_colour(s), autobinx=False,
                              hovertemplate=f"{s}<br>τ %{{x}}<br>%{{y}} result(s)<extra></extra>")
    pad = bins["size"] * 1.5
    fig.update_layout(title=title, barmode="overlay", xaxis_title="tokens per forward pass",
                      yaxis_title="results", height=420, bargap=0.05,
                      xaxis_range=[bins["start"] - pad, bins["end"] + pad])
    fig.update_yaxes(rangemode="tozero")
    return fig


# ------------------------------------------------------------------------------------- parameter sweeps
SWEEP_AUTO = "auto"
SWEEP_COLUMNS = ["value", "category", "variant", "speedup", "rouge_l_vs_ar", "ppl_change_pct", "n", "runs"]


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not (isinstance(v, float) and math.isnan(v))


def _params(v) -> dict:
    return v if isinstance(v, dict) else {}


def _quality_values(df: pd.DataFrame, key: str) -> pd.Series:
    """A quality figure per row: the `q_<key>` column, else the `quality` dicts, else NaN."""
    if f"q_{key}" in df:
        return _num(df[f"q_{key}"])
    if "quality" in df:
        return _num(pd.Series([q.get(key) if isinstance(q, dict) else None for q in df["quality"]], index=df.index))
    return pd.Series(float("nan"), index=df.index)


def _sweep_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Error-free rows of the runs that include `ar` (a sweep point is always measured against its own run's ar)."""
    df = _ok(df)
    if len(df) == 0 or "params" not in df or "strategy" not in df:
        return pd.DataFrame()
    with_ar = set(df.loc[df["strategy"] == "ar", "run_id"])
    return df[df["run_id"].isin(with_ar)]


def sweep_candidates(df: pd.DataFrame) -> list[dict]:
    """Every (strategy, numeric parameter) that takes two or more values among the results of runs that also ran
    `ar`: [{"strategy", "param", "values", "runs", "key"}], most values first. `key` ('strategy:param') is what
    `sweep_table` and `sweep_chart` take."""
    df = _sweep_rows(df)
    if len(df) == 0:
        return []
    if "strategy_shown" in df:
        df = df[df["strategy_shown"]]
    out = []
    for s, d in df[df["strategy"] != "ar"].groupby("strategy", sort=True):
        values: dict[str, set] = {}
        runs: dict[str, set] = {}
        for params, run_id in zip(d["params"], d["run_id"]):
            for k, v in _params(params).items():
                if _is_number(v):
                    values.setdefault(k, set()).add(float(v))
                    runs.setdefault(k, set()).add(int(run_id))
        for k, vals in values.items():
            if len(vals) >= 2:
                out.append({"strategy": str(s), "param": k, "values": sorted(vals), "runs": len(runs[k]),
                            "key": f"{s}:{k}"})
    return sorted(out, key=lambda c: (-len(c["values"]), c["strategy"], c["param"]))


def sweep_choices(df: pd.DataFrame) -> list[tuple[str, str]]:
    """(label, key) pairs for a picker: 'automatic' first, then every sweep found."""
    return [("automatic (the sweep with most values)", SWEEP_AUTO)] + [
        (f"{c['strategy']} · {c['param']} ({len(c['values'])} values, {c['runs']} runs)", c["key"])
        for c in sweep_candidates(df)]


def _pick_sweep(df: pd.DataFrame, key: str | None) -> tuple[str, str] | None:
    cands = sweep_candidates(df)
    if key in (None, "", SWEEP_AUTO):
        return (cands[0]["strategy"], cands[0]["param"]) if cands else None
    for c in cands:
        if c["key"] == key:
            return c["strategy"], c["param"]
    return None


def sweep_table(df: pd.DataFrame, strategy: str, param: str) -> pd.DataFrame:
    """Speed-up and quality of `strategy` against the value of its numeric parameter `param`.

    Inside each run and category: speed-up = mean tokens/s of the strategy's rows with that value / mean
    tokens/s of the run's `ar` rows; ROUGE-L vs ar = mean over those rows; perplexity change = their mean
    perplexity / ar's mean perplexity - 1 (%). Runs with the same value, category and variant are then averaged
    (`runs` counts them, `n` the results). `variant` names the strategy's other parameters where they differ
    between the rows (e.g. two adapters), so unlike settings never share a line; categories and 'all' by
    `paradec.metrics.by_category`, as in `speedup_table`."""
    df = _sweep_rows(df)
    if len(df) == 0:
        return pd.DataFrame(columns=SWEEP_COLUMNS)
    mine = df[(df["strategy"] == strategy) & df["params"].map(lambda p: _is_number(_params(p).get(param)))]
    if len(mine) == 0:
        return pd.DataFrame(columns=SWEEP_COLUMNS)
    mine = mine.assign(_value=mine["params"].map(lambda p: float(p[param])))
    others = {k for p in mine["params"] for k in _params(p) if k != param}
    varying = sorted(k for k in others if len({repr(_params(p).get(k)) for p in mine["params"]}) > 1)
    mine = mine.assign(_variant=mine["params"].map(
        lambda p: ", ".join(f"{k}={_params(p).get(k)}" for k in varying)))
    points = []
    for run_id, cat, d in by_category(df[df["run_id"].isin(set(mine["run_id"]))]):
        ar = d[d["strategy"] == "ar"]
        m = mine[mine.index.isin(d.index)]
        ar_tps = _num(ar["tokens_per_s"]).dropna().tolist()
        ar_ppl = _quality_values(ar, "perplexity").dropna()
        for (value, variant), dv in m.groupby(["_value", "_variant"]):
            sp = speedup(_num(dv["tokens_per_s"]).dropna().tolist(), ar_tps)
            rouge = _quality_values(dv, "rouge_l_vs_ar").dropna()
            ppl = _quality_values(dv, "perplexity").dropna()
            change = (100 * (ppl.mean() / ar_ppl.mean() - 1)) if len(ppl) and len(ar_ppl) and ar_ppl.mean() \
                else None
            points.append({"run_id": int(run_id), "value": value, "category": str(cat), "variant": variant,
                           "speedup": sp, "rouge_l_vs_ar": rouge.mean() if len(rouge) else None,
                           "ppl_change_pct": change, "n": len(dv)})
    if not points:
        return pd.DataFrame(columns=SWEEP_COLUMNS)
    p = pd.DataFrame(points)
    for c in ("speedup", "rouge_l_vs_ar", "ppl_change_pct"):
        p[c] = _num(p[c])
    g = (p.groupby(["value", "category", "variant"], sort=True)
         .agg(speedup=("speedup", "mean"), rouge_l_vs_ar=("rouge_l_vs_ar", "mean"),
              ppl_change_pct=("ppl_change_pct", "mean"), n=("n", "sum"), runs=("run_id", "nunique"))
         .reset_index())
    return g[SWEEP_COLUMNS]


_PALETTE = ("#636EFA", "#EF553B", "#00CC96", "#AB63FA", "#FFA15A", "#19D3F3", "#FF6692", "#B6E880", "#FF97FF",
            "#FECB52")


def sweep_chart(df: pd.DataFrame, key: str | None = SWEEP_AUTO) -> go.Figure:
    """Speed-up vs ar, ROUGE-L vs ar and (where measured) the perplexity change against the value of one
    strategy parameter, one line per category: the sweep `key` ('strategy:param'), or the one with most values
    when 'auto'. A message instead when the selected runs hold no such sweep."""
    picked = _pick_sweep(df, key)
    if picked is None:
        why = ("no parameter sweep in the selected runs: it needs runs of one strategy (each with `ar`) that differ "
               "in one numeric parameter, e.g. `python -m paradec.training.lud_train sweep`")
        if key not in (None, "", SWEEP_AUTO):
            why = f"the sweep {key!r} is not in the selected runs; pick another or 'automatic'"
        return _empty("Parameter sweep", why)
    strategy, param = picked
    t = sweep_table(df, strategy, param)
    title = f"Parameter sweep: {strategy} · {param} (speed-up and quality vs ar, within each run)"
    if len(t) == 0:
        return _empty(title, "no paired results for this sweep")
    has_ppl = t["ppl_change_pct"].notna().any()
    rows = 3 if has_ppl else 2
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.07,
                        subplot_titles=("speed-up vs ar (×)", "ROUGE-L vs ar", "perplexity change vs ar (%)")[:rows])
    lines = list(t.groupby(["category", "variant"], sort=True))
    for i, ((cat, variant), d) in enumerate(lines):
        d = d.sort_values("value")
        name = str(cat) + (f" · {variant}" if variant else "")
        colour = _PALETTE[i % len(_PALETTE)]
        custom = list(zip(d["n"], d["runs"]))
        for row, col, fmt in ((1, "speedup", ".2f"), (2, "rouge_l_vs_ar", ".3f"), (3, "ppl_change_pct", "+.1f")):
            if row > rows:
                continue
            fig.add_scatter(x=d["value"], y=d[col], mode="lines+markers", name=name, legendgroup=name,
                            showlegend=row == 1, line={"color": colour}, marker={"color": colour}, customdata=custom,
                            hovertemplate=f"{name}<br>{param} = %{{x}}<br>%{{y:{fmt}}}<br>n=%{{customdata[0]}} "
                                          "results in %{customdata[1]} run(s)<extra></extra>", row=row, col=1)
    fig.add_hline(y=1.0, line_dash="dot", row=1, col=1)
    fig.update_yaxes(range=[-0.05, 1.05], row=2, col=1)
    fig.update_xaxes(title_text=param, row=rows, col=1)
    fig.update_layout(title=title, height=260 + 170 * rows, legend_title="category", hovermode="closest")
    return fig


# ------------------------------------------------------------------------------------- long context
LONGCONTEXT_COLUMNS = ["run_id", "strategy", "item_key", "category", "approx_tokens", "depth_percent",
                       "input_tokens", "context_length", "correct", "ttft_s", "e2e_s"]
PASSKEY = ("passkey", "passkey-control")


def longcontext_frame(df: pd.DataFrame, passkey_only: bool = False) -> pd.DataFrame:
    """The long-context results (`evals/longcontext_eval.py`: run kind 'longcontext', each result with
    meta approx_tokens / depth_percent / input_tokens / context_length (the window) and quality `correct`), one
    row each; `passkey_only` keeps the passkey items (the length x depth views)."""
    df = _ok(df)
    if len(df) == 0 or "m_approx_tokens" not in df or "m_depth_percent" not in df:
        return pd.DataFrame(columns=LONGCONTEXT_COLUMNS)
    if passkey_only and "category" in df:
        df = df[df["category"].isin(PASSKEY)]
    if "strategy_shown" in df:
        df = df[df["strategy_shown"]]
    if "run_kind" in df:
        df = df[df["run_kind"] == "longcontext"]
    out = pd.DataFrame({
        "run_id": df["run_id"], "strategy": df["strategy"], "item_key": df["item_key"],
        "category": df["category"] if "category" in df else "passkey",
        "approx_tokens": _num(df["m_approx_tokens"]), "depth_percent": _num(df["m_depth_percent"]),
        "input_tokens": _num(df["m_input_tokens"]) if "m_input_tokens" in df else float("nan"),
        "context_length": _num(df["m_context_length"]) if "m_context_length" in df else float("nan"),
        "correct": _quality_values(df, "correct"),
        "ttft_s": _num(df["ttft_s"]) if "ttft_s" in df else float("nan"),
        "e2e_s": _num(df["e2e_s"]) if "e2e_s" in df else float("nan")})
    return out.dropna(subset=["approx_tokens", "depth_percent", "correct"]).reset_index(drop=True)


def _strategy_order(names) -> list[str]:
    seen: list[str] = []
    for n in names:
        if n not in seen:
            seen.append(n)
    return seen


def longcontext_accuracy(df: pd.DataFrame, by=("approx_tokens",), passkey_only: bool = True) -> pd.DataFrame:
    """Accuracy (share of correct answers) per strategy and `by` (approx_tokens, depth_percent and/or category),
    with the counts: columns strategy, *by, correct, n, accuracy; passkey items only unless told."""
    lc = longcontext_frame(df, passkey_only)
    cols = ["strategy", *by, "correct", "n", "accuracy"]
    if len(lc) == 0:
        return pd.DataFrame(columns=cols)
    g = (lc.groupby(["strategy", *by], sort=False).agg(correct=("correct", "sum"), n=("correct", "size"))
         .reset_index())
    g["correct"] = g["correct"].astype(int)
    g["accuracy"] = g["correct"] / g["n"]
    order = {s: i for i, s in enumerate(_strategy_order(lc["strategy"]))}
    return g.sort_values(["strategy", *by], key=lambda c: c.map(order) if c.name == "strategy" else c)[cols] \
        .reset_index(drop=True)


_LC_EMPTY = ("no long-context results in the selected runs: run `python evals/longcontext_eval.py` "
             "(it stores a run of kind 'longcontext')")


def _context_length(lc: pd.DataFrame) -> int | None:
    ctx = lc["context_length"].dropna()
    return int(ctx.median()) if len(ctx) else None


def longcontext_length_chart(df: pd.DataFrame) -> go.Figure:
    """Passkey accuracy against input length (approximate tokens, log scale; the tick labels give the
    multiple of the context window), one line per strategy; the context window as a dotted line."""
    title = "Long context: passkey accuracy by input length"
    lc = longcontext_frame(df, passkey_only=True)
    if len(lc) == 0:
        return _empty(title, _LC_EMPTY)
    t = longcontext_accuracy(df, ("approx_tokens",))
    ctx = _context_length(lc)
    fig = go.Figure()
    for s in _strategy_order(t["strategy"]):
        d = t[t["strategy"] == s].sort_values("approx_tokens")
        fig.add_scatter(x=d["approx_tokens"], y=d["accuracy"], mode="lines+markers", name=str(s),
                        line={"color": strategy_colour(s)}, marker={"color": strategy_colour(s)},
                        customdata=list(zip(d["correct"], d["n"])),
                        hovertemplate=f"{s}<br>~%{{x:.0f}} tokens<br>accuracy %{{y:.2f}} "
                                      "(%{customdata[0]}/%{customdata[1]})<extra></extra>")
    lengths = sorted(t["approx_tokens"].unique())
    text = [f"{v:.0f}" + (f"<br>({v / ctx:.2g}× ctx)" if ctx else "") for v in lengths]
    fig.update_xaxes(type="log", tickvals=lengths, ticktext=text, title_text="input length (approx. tokens)")
    if ctx:
        fig.add_vline(x=ctx, line_dash="dot")
        # an annotation on a log axis is placed by log10 of the value (a shape by the value itself)
        fig.add_annotation(x=math.log10(ctx), y=1.0, yref="paper", text=f"context window {ctx}", showarrow=False,
                           xanchor="left", yanchor="bottom")
    fig.update_layout(title=title, yaxis_title="accuracy", yaxis_range=[-0.05, 1.05], height=400,
                      legend_title="strategy")
    return fig


def longcontext_heatmap(df: pd.DataFrame) -> go.Figure:
    """Accuracy per input length (rows) and depth of the key (columns), one panel per strategy; each cell
    shows correct/n."""
    title = "Long context: passkey accuracy by length × depth"
    lc = longcontext_frame(df, passkey_only=True)
    if len(lc) == 0:
        return _empty(title, _LC_EMPTY)
    t = longcontext_accuracy(df, ("approx_tokens", "depth_percent"))
    strategies = _strategy_order(t["strategy"])
    lengths = sorted(t["approx_tokens"].unique())
    depths = sorted(t["depth_percent"].unique())
    ylab = [f"~{v:.0f}" for v in lengths]
    xlab = [f"{v:g}%" for v in depths]
    fig = make_subplots(rows=1, cols=len(strategies), subplot_titles=strategies, shared_yaxes=True,
                        horizontal_spacing=0.04)
    for i, s in enumerate(strategies, 1):
        d = t[t["strategy"] == s].set_index(["approx_tokens", "depth_percent"])
        z = [[d["accuracy"].get((n, dp)) for dp in depths] for n in lengths]
        txt = [[f"{int(d['correct'][(n, dp)])}/{int(d['n'][(n, dp)])}" if (n, dp) in d.index else ""
                for dp in depths] for n in lengths]
        fig.add_trace(go.Heatmap(z=z, x=xlab, y=ylab, text=txt, texttemplate="%{text}", zmin=0, zmax=1,
                                 colorscale="Viridis", showscale=i == len(strategies),
                                 colorbar={"title": "accuracy"},
                                 hovertemplate=f"{s}<br>length %{{y}} tokens<br>depth %{{x}}<br>accuracy %{{z:.2f}} "
                                               "(%{text})<extra></extra>"), row=1, col=i)
        fig.update_xaxes(title_text="depth of the key", row=1, col=i)
    fig.update_yaxes(title_text="input length (tokens)", row=1, col=1)
    fig.update_layout(title=title, height=420)
    return fig


def longcontext_task_chart(df: pd.DataFrame) -> go.Figure:
    """Accuracy per long-context task (passkey, its in-window control, key-value retrieval, document QA) and
    strategy, every length together; each bar's hover gives correct/n."""
    title = "Long context: accuracy by task"
    lc = longcontext_frame(df)
    if len(lc) == 0:
        return _empty(title, _LC_EMPTY)
    t = longcontext_accuracy(df, ("category",), passkey_only=False)
    fig = go.Figure()
    for s in _strategy_order(t["strategy"]):
        d = t[t["strategy"] == s]
        fig.add_bar(x=d["category"], y=d["accuracy"], name=str(s), marker_color=strategy_colour(s),
                    text=[f"{c}/{n}" for c, n in zip(d["correct"], d["n"])], textposition="outside",
                    hovertemplate=f"{s}<br>%{{x}}<br>accuracy %{{y:.2f}} (%{{text}})<extra></extra>")
    fig.update_layout(title=title, barmode="group", yaxis_title="accuracy", yaxis_range=[0, 1.15], height=400,
                      legend_title="strategy")
    return fig


def longcontext_cost_chart(df: pd.DataFrame) -> go.Figure:
    """Prefill time (time to the first token, median over the items of a length) against input length, one
    line per strategy, log-log: what full attention, the truncated baseline and the chunked methods cost."""
    title = "Long context: prefill time by input length"
    lc = longcontext_frame(df)
    lc = lc[lc["ttft_s"].notna()] if len(lc) else lc
    if len(lc) == 0:
        return _empty(title, _LC_EMPTY)
    t = lc.groupby(["strategy", "approx_tokens"], sort=False)["ttft_s"].median().reset_index()
    fig = go.Figure()
    for s in _strategy_order(lc["strategy"]):
        d = t[t["strategy"] == s].sort_values("approx_tokens")
        fig.add_scatter(x=d["approx_tokens"], y=d["ttft_s"], mode="lines+markers", name=str(s),
                        line={"color": strategy_colour(s)}, marker={"color": strategy_colour(s)},
                        hovertemplate=f"{s}<br>~%{{x:.0f}} tokens<br>prefill %{{y:.2f}} s<extra></extra>")
    fig.update_xaxes(type="log", title_text="input length (approx. tokens)")
    fig.update_yaxes(type="log", title_text="time to first token (s, median)")
    fig.update_layout(title=title, height=400, legend_title="strategy")
    return fig


# ------------------------------------------------------------------------------------- the Arena's race chart
def race_series(lanes: dict[str, dict]) -> dict[str, tuple[list[float], list[int]]]:
    """{strategy: (own compute time of each token group, tokens so far)} from lane snapshots (each with
    `groups`: [{"t", "ids"}]), starting at (0, 0)."""
    out = {}
    for name, d in lanes.items():
        xs, ys, n = [0.0], [0], 0
        for g in d.get("groups") or []:
            n += len(g.get("ids") or [])
            xs.append(float(g["t"]))
            ys.append(n)
        out[name] = (xs, ys)
    return out


def race_chart(lanes: dict[str, dict], t_now: float | None = None) -> go.Figure:
    """Tokens against each strategy's own compute time, one line per strategy (the Arena's live chart).
    `t_now` (the replay's clock) extends the x axis so lines grow at their true pace."""
    fig = go.Figure()
    series = race_series(lanes)
    for name, (xs, ys) in series.items():
        c = strategy_colour(name)
        fig.add_scatter(x=xs, y=ys, mode="lines", name=name, line={"color": c, "width": 2, "shape": "hv"},
                        hovertemplate=f"{name}<br>%{{y}} tokens after %{{x:.2f}} s<extra></extra>")
    x_max = max([xs[-1] for xs, _ in series.values()] + [t_now or 0.0, 0.5])
    y_max = max([ys[-1] for _, ys in series.values()] + [4])
    fig.update_layout(title={"text": "Tokens vs own compute time", "font": {"size": 14}}, height=280,
                      margin={"l": 50, "r": 10, "t": 40, "b": 40}, legend=_legend_below() | {"y": -0.25},
                      xaxis={"title": "seconds of the strategy's own compute", "range": [0, x_max * 1.05]},
                      yaxis={"title": "tokens (SoT: skeleton too)", "range": [0, y_max * 1.08]},
                      uirevision="race")
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
