"""The Dashboard tab: pick runs, filter, chart, export.

All figures come from `paradec.ui.charts` (plain functions of the results DataFrame); this module only reads
the store and wires the controls. The charts are drawn when the page opens, when the tab is selected and when
a race or a benchmark ends.

Besides the user's own runs the tab offers a *reference* dataset: the project's own benchmark runs on the
default model, shipped as a SQLite file (`data/reference/reference.db`, or `$PARADEC_REFERENCE_DB`; made from
the benchmark command's database by `python -m evals.make_reference data/bench.db`). It is a
separate source, picked in the "Data" control and labelled in the page: its rows are never mixed into the
user's runs, and a newcomer with no runs sees it first.
"""
from __future__ import annotations

import html
import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

import gradio as gr
import pandas as pd

from ..bench import table
from ..csvsafe import write_csv
from . import charts


ROOT = Path(__file__).resolve().parents[2]
REFERENCE_DB = ROOT / "data" / "reference" / "reference.db"
MINE, REFERENCE = "mine", "reference"
SOURCE_CHOICES = [("Your runs", MINE), ("Reference: paradec's own benchmark runs on the default model", REFERENCE)]


def reference_path() -> Path | None:
    """The shipped reference database ($PARADEC_REFERENCE_DB overrides; '' turns it off), or None."""
    env = os.environ.get("PARADEC_REFERENCE_DB")
    p = Path(env) if env else REFERENCE_DB
    return p if env != "" and p.is_file() else None


def open_reference(path: Path | None):
    """A Store on a private copy of the reference file (the shipped file is never written, not even WAL)."""
    if path is None:
        return None
    from ..store import Store
    tmp = Path(tempfile.mkdtemp(prefix="paradec-reference-")) / "reference.db"
    shutil.copyfile(path, tmp)
    return Store(f"sqlite:///{tmp}")


def make_reference(src: str, dst: str | os.PathLike = REFERENCE_DB) -> Path:
    """Copy a results database (e.g. the benchmark command's data/bench.db) into one self-contained SQLite file
    (WAL folded in) to ship as the reference dataset."""
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    with sqlite3.connect(src) as a, sqlite3.connect(tmp) as b:
        a.backup(b)
    with sqlite3.connect(tmp) as b:
        b.execute("PRAGMA journal_mode=DELETE")
    tmp.replace(dst)
    return dst


def _run_label(r: dict) -> str:
    created = r["created_at"].strftime("%Y-%m-%d %H:%M") if r.get("created_at") else ""
    return f"#{r['id']} {r['kind']} · {r['name'][:40]} · {r['model']} · {created} ({r['n_results']} rows)"


class Dashboard:
    def __init__(self, store, reference=...):
        """`reference`: a Store of reference runs, None for none, or (default) the shipped reference file."""
        self.store = store
        self.reference = open_reference(reference_path()) if reference is ... else reference
        self.export_dir = Path(tempfile.mkdtemp(prefix="paradec-export-"))

    def source(self, which) -> object:
        return self.reference if which == REFERENCE and self.reference is not None else self.store

    def auto_source(self) -> str:
        """What a page shows before the user picks: their runs, or the reference when they have none yet."""
        if self.reference is not None and not self.store.list_runs(limit=1):
            return REFERENCE
        return MINE

    def choices(self, which=MINE):
        store = self.source(which)
        runs = store.list_runs(limit=500)
        df = store.results_dataframe(light=True)
        strategies = sorted(df["strategy"].dropna().unique().tolist()) if len(df) else []
        categories = sorted(df["category"].dropna().unique().tolist()) if len(df) else []
        models = sorted({r["model"] for r in runs if r.get("model")})
        return runs, strategies, categories, models, charts.sweep_choices(df)

    def refresh_choices(self, which=MINE):
        runs, strategies, categories, models, sweeps = self.choices(which)
        return (gr.update(choices=[(_run_label(r), r["id"]) for r in runs]),
                gr.update(choices=["all"] + models), gr.update(choices=strategies), gr.update(choices=categories),
                charts.runs_table(runs), gr.update(choices=sweeps))

    def _info(self, which, df, n_runs) -> str:
        counts = f"{len(df)} result rows from {n_runs} run(s)."
        if which == REFERENCE and self.reference is not None:
            return (f"**Showing the reference runs** — paradec's own benchmark on the default model, shipped with "
                    f"the app; not your runs. {counts} Pick “Your runs” under *Data* to see yours.")
        if not self.store.list_runs(limit=1):
            more = " or look at the reference runs (pick them under *Data*)" if self.reference is not None else ""
            return ("**No runs yet.** Race strategies in the **Arena** or run a benchmark under **Eval sets**; "
                    f"every run appears here when it ends{more}.")
        return counts

    def show(self, runs, model, strategies, categories, since, sweep=charts.SWEEP_AUTO, which=MINE):
        """Filter the stored results and draw every chart; also the summary table, the CSV and the warning.
        `sweep` picks the parameter sweep to chart ('strategy:param', or 'auto': the one with most values);
        `which` the data: 'mine' (the user's runs) or 'reference' (the shipped reference runs)."""
        try:
            charts.parse_since(since)
        except ValueError as e:
            raise gr.Error(str(e)) from None
        store = self.source(which)
        run_ids = [int(r) for r in runs] if runs else None
        df = store.results_dataframe(run_ids)
        df = charts.filter_results(df, runs=run_ids, model=model, strategies=strategies, categories=categories,
                                   since=since)
        warn = charts.env_warning(df)
        warning = f"⚠️ {html.escape(warn)}" if warn else ""
        n_runs = df["run_id"].nunique() if len(df) else 0
        info = self._info(which, df, n_runs)
        summary = charts.summary_frame(table(df) if len(df) else [])
        export = write_csv(charts.export_frame(df), self.export_dir)   # one file per request, formula-safe
        sweeps = charts.sweep_choices(df)
        sweep = sweep or charts.SWEEP_AUTO      # a pick absent from these runs is kept: its chart says so
        return (warning, info, charts.speedup_bar(df), charts.latency_box(df), charts.quality_scatter(df),
                charts.tokens_per_pass_hist(df), summary, gr.update(value=str(export), interactive=len(df) > 0),
                charts.sweep_chart(df, sweep), gr.update(choices=sweeps, value=sweep),
                charts.longcontext_length_chart(df), charts.longcontext_heatmap(df), charts.longcontext_task_chart(df),
                charts.longcontext_cost_chart(df))

    def switch_source(self, which):
        """The run list of the other data source, with nothing picked from the old one."""
        runs, *rest = self.refresh_choices(which)
        return (gr.update(choices=runs["choices"], value=[]), *rest)

    def open(self, which, picked, runs, model, strategies, categories, since, sweep):
        """The tab opened, the page loaded or a run ended: fresh run lists and every chart drawn. Until the user
        picks the data, it is the reference for a newcomer with no runs and their own runs otherwise."""
        if not picked:
            which = self.auto_source()
        if which == REFERENCE and self.reference is None:
            which = MINE
        known = {r["id"] for r in self.source(which).list_runs(limit=500)}
        runs = [r for r in (runs or []) if int(r) in known]
        drawn = self.show(runs, model, strategies, categories, since, sweep, which)
        return (gr.update(value=which), *self.refresh_choices(which)[:5], *drawn)

    def build(self):
        runs, strategies, categories, models, sweeps = self.choices()
        has_ref = self.reference is not None
        which = gr.Radio(SOURCE_CHOICES, value=MINE, label="Data", visible=has_ref, elem_id="pd-dash-source",
                         info="the reference runs are a separate dataset, never mixed into yours")
        picked = gr.State(False)
        with gr.Row():
            run_pick = gr.Dropdown([(_run_label(r), r["id"]) for r in runs], multiselect=True,
                                   label="Runs (none = all)", scale=3, allow_custom_value=True, elem_id="pd-dash-runs")
            model = gr.Dropdown(["all"] + models, value="all", label="Model", scale=1, allow_custom_value=True)
        with gr.Row():
            strat = gr.Dropdown(strategies, multiselect=True, label="Strategies (none = all; ar is always kept "
                                "as the reference)", scale=2, allow_custom_value=True)
            cats = gr.Dropdown(categories, multiselect=True, label="Categories (none = all)", scale=2,
                               allow_custom_value=True)
            since = gr.Textbox("", label="Since (YYYY-MM-DD)", placeholder="2025-01-31", scale=1)
        with gr.Row():
            show_btn = gr.Button("Show", variant="primary", elem_id="pd-dash-show")
            reload_btn = gr.Button("Reload run list")
            export_btn = gr.DownloadButton("Export filtered rows (CSV)", value=None, interactive=False,
                                           elem_id="pd-dash-export")
        warning = gr.Markdown("", elem_id="pd-dash-warning")
        info = gr.Markdown("", elem_id="pd-dash-info")
        with gr.Row():
            p_speed = gr.Plot(label="Speed-up", elem_id="pd-plot-speedup")
            p_quality = gr.Plot(label="Quality vs speed", elem_id="pd-plot-quality")
        with gr.Row():
            p_latency = gr.Plot(label="Latency", elem_id="pd-plot-latency")
            p_tau = gr.Plot(label="Tokens per pass", elem_id="pd-plot-tau")
        with gr.Row():
            sweep = gr.Dropdown(sweeps, value=charts.SWEEP_AUTO, label="Parameter sweep (a strategy's runs that "
                                "differ in one numeric parameter, each against its own ar)", scale=1,
                                allow_custom_value=True, elem_id="pd-dash-sweep")
        p_sweep = gr.Plot(label="Parameter sweep", elem_id="pd-plot-sweep")
        with gr.Row():
            p_lc_len = gr.Plot(label="Long context: accuracy by length", elem_id="pd-plot-lc-length")
            p_lc_heat = gr.Plot(label="Long context: length × depth", elem_id="pd-plot-lc-heatmap")
        with gr.Row():
            p_lc_task = gr.Plot(label="Long context: accuracy by task", elem_id="pd-plot-lc-task")
            p_lc_cost = gr.Plot(label="Long context: prefill time", elem_id="pd-plot-lc-cost")
        summary = gr.Dataframe(charts.summary_frame([]), label="Summary per run, category and strategy",
                               interactive=False, elem_id="pd-dash-summary", wrap=True,
                               column_widths=charts.SUMMARY_WIDTHS)
        history = gr.Dataframe(charts.runs_table(runs), label="Run history", interactive=False,
                               elem_id="pd-dash-history", wrap=True)

        inputs = [run_pick, model, strat, cats, since, sweep, which]
        outs = [warning, info, p_speed, p_latency, p_quality, p_tau, summary, export_btn, p_sweep, sweep, p_lc_len,
                p_lc_heat, p_lc_task, p_lc_cost]
        show_btn.click(self.show, inputs, outs, api_name="dashboard", concurrency_limit=None)
        sweep.input(self.show, inputs, outs, api_visibility="undocumented", concurrency_limit=None)
        refresh_outs = [run_pick, model, strat, cats, history, sweep]
        reload_btn.click(self.refresh_choices, [which], refresh_outs, api_name="dashboard_choices",
                         concurrency_limit=None)
        open_inputs = [which, picked, run_pick, model, strat, cats, since, sweep]
        open_outs = [which, run_pick, model, strat, cats, history] + outs
        # the user picked the data: keep it from now on, new run lists, charts drawn
        which.input(lambda: True, None, [picked], queue=False, api_visibility="undocumented").then(
            self.switch_source, [which], refresh_outs,
            api_visibility="undocumented", concurrency_limit=None).then(
            self.show, inputs, outs, api_visibility="undocumented", concurrency_limit=None)
        return {"refresh_outputs": refresh_outs, "refresh": self.refresh_choices, "show": (self.show, inputs, outs),
                "open": (self.open, open_inputs, open_outs), "runs": run_pick, "source": which, "picked": picked}

