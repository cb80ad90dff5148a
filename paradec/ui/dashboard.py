"""The Dashboard tab: pick runs, filter, chart, export.

All figures come from `paradec.ui.charts` (plain functions of the results DataFrame); this module only reads
the store and wires the controls.
"""
from __future__ import annotations

import html
import tempfile
from pathlib import Path

import gradio as gr
import pandas as pd

from ..bench import table
from . import charts


def _run_label(r: dict) -> str:
    created = r["created_at"].strftime("%Y-%m-%d %H:%M") if r.get("created_at") else ""
    return f"#{r['id']} {r['kind']} · {r['name'][:40]} · {r['model']} · {created} ({r['n_results']} rows)"


class Dashboard:
    def __init__(self, store):
        self.store = store
        self.export_dir = Path(tempfile.mkdtemp(prefix="paradec-export-"))

    def choices(self):
        runs = self.store.list_runs(limit=500)
        df = self.store.results_dataframe(light=True)
        strategies = sorted(df["strategy"].dropna().unique().tolist()) if len(df) else []
        categories = sorted(df["category"].dropna().unique().tolist()) if len(df) else []
        models = sorted({r["model"] for r in runs if r.get("model")})
        return runs, strategies, categories, models, charts.sweep_choices(df)

    def refresh_choices(self):
        runs, strategies, categories, models, sweeps = self.choices()
        return (gr.update(choices=[(_run_label(r), r["id"]) for r in runs]),
                gr.update(choices=["all"] + models), gr.update(choices=strategies), gr.update(choices=categories),
                charts.runs_table(runs), gr.update(choices=sweeps))

    def show(self, runs, model, strategies, categories, since, sweep=charts.SWEEP_AUTO):
        """Filter the stored results and draw every chart; also the summary table, the CSV and the warning.
        `sweep` picks the parameter sweep to chart ('strategy:param', or 'auto': the one with most values)."""
        try:
            charts.parse_since(since)
        except ValueError as e:
            raise gr.Error(str(e)) from None
        run_ids = [int(r) for r in runs] if runs else None
        df = self.store.results_dataframe(run_ids)
        df = charts.filter_results(df, runs=run_ids, model=model, strategies=strategies, categories=categories,
                                   since=since)
        warn = charts.env_warning(df)
        warning = f"⚠️ {html.escape(warn)}" if warn else ""
        n_runs = df["run_id"].nunique() if len(df) else 0
        info = f"{len(df)} result rows from {n_runs} run(s)."
        summary = pd.DataFrame(table(df)) if len(df) else pd.DataFrame()
        export = self.export_dir / "paradec-results.csv"
        charts.export_frame(df).to_csv(export, index=False)
        sweeps = charts.sweep_choices(df)
        sweep = sweep or charts.SWEEP_AUTO      # a pick absent from these runs is kept: its chart says so
        return (warning, info, charts.speedup_bar(df), charts.latency_box(df), charts.quality_scatter(df),
                charts.tokens_per_pass_hist(df), summary, gr.update(value=str(export), interactive=len(df) > 0),
                charts.sweep_chart(df, sweep), gr.update(choices=sweeps, value=sweep),
                charts.longcontext_length_chart(df), charts.longcontext_heatmap(df))

    def build(self):
        runs, strategies, categories, models, sweeps = self.choices()
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
        info = gr.Markdown("")
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
        summary = gr.Dataframe(label="Summary per run, category and strategy", interactive=False)
        history = gr.Dataframe(charts.runs_table(runs), label="Run history", interactive=False)

        inputs = [run_pick, model, strat, cats, since, sweep]
        outs = [warning, info, p_speed, p_latency, p_quality, p_tau, summary, export_btn, p_sweep, sweep, p_lc_len,
                p_lc_heat]
        show_btn.click(self.show, inputs, outs, api_name="dashboard", concurrency_limit=None)
        sweep.input(self.show, inputs, outs, api_visibility="undocumented", concurrency_limit=None)
        refresh_outs = [run_pick, model, strat, cats, history, sweep]
        reload_btn.click(self.refresh_choices, None, refresh_outs, api_name="dashboard_choices",
                         concurrency_limit=None)
        return {"refresh_outputs": refresh_outs, "refresh": self.refresh_choices, "show": (self.show, inputs, outs)}
