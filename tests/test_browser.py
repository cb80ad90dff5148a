"""The real page in headless Chromium (Debian's /usr/bin/chromium driven by Playwright): type a prompt, race,
watch every column stream, Stop, upload an eval set, open the Dashboard and see a plot. Saves a screenshot
of the Arena mid-race to docs/arena.png."""
from __future__ import annotations

import json
import re
import os
import socket
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is absent: install Debian's chromium (apt-get install -y chromium) to run the browser "
                "test", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api")

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-quic"]
COLS = ["ar", "pld", "lookahead"]


@pytest.fixture(scope="module")
def app(tmp_path_factory, default_engine):
    import torch
    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT))
    from app import build_app, launch
    from paradec.store import Store
    store = Store(f"sqlite:///{tmp_path_factory.mktemp('browserdb') / 'app.db'}")
    demo = build_app(default_engine, store)     # the shipped model: the screenshot shows real output
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    launch(demo, "127.0.0.1", port, prevent_thread_lock=True, quiet=True)
    yield {"url": f"http://127.0.0.1:{port}/", "store": store}
    demo.close()
    store.close()


@pytest.fixture(scope="module")
def page():
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        ctx = browser.new_context(viewport={"width": 1500, "height": 1000})
        pg = ctx.new_page()
        pg.set_default_timeout(60_000)
        yield pg
        browser.close()


def test_arena_race_stop_upload_dashboard(app, page, tmp_path):
    store = app["store"]
    page.goto(app["url"])
    prompt = page.locator("#pd-prompt textarea")
    prompt.wait_for()
    prompt.fill("import os\nimport sys\n\n\ndef copy_tree(src, dst):\n    \"\"\"Copy a directory tree.\"\"\"\n")
    page.get_by_label("raw completion").check()
    for name in COLS:       # the default selection races ar, pld and lookahead
        assert page.get_by_role("checkbox", name=re.compile(rf"^{re.escape(name)} —")).first.is_checked(), name
    n = page.locator("#pd-max-new input[type=number]")
    n.fill("480")
    n.press("Enter")
    page.locator("#pd-run").click()

    # every column streams text while the race is still running
    page.wait_for_function(
        """(n) => { const cols = [...Array(n).keys()].map(i => document.querySelector(`#pd-col-${i} .pd-col`));
                    return cols.every(c => c && c.querySelector('.pd-text') &&
                                      c.querySelector('.pd-text').innerText.trim().length > 0); }""",
        arg=len(COLS), timeout=120_000)
    statuses = [page.locator(f"#pd-col-{i} .pd-col").get_attribute("data-status") for i in range(len(COLS))]
    names = [page.locator(f"#pd-col-{i} .pd-col").get_attribute("data-strategy") for i in range(len(COLS))]
    assert names == COLS
    assert "running" in statuses, f"the race finished before it could be seen streaming: {statuses}"
    assert page.locator("#pd-col-3").is_hidden()      # unused slots stay hidden
    assert "forward passes" in page.locator("#pd-col-0").inner_text()
    (ROOT / "docs").mkdir(exist_ok=True)
    try:    # a fuller picture for the README: let the columns fill a little (not a requirement of the test)
        page.wait_for_function("() => (document.querySelector('#pd-col-0 .pd-text')||{}).innerText?.length > 150",
                               timeout=8_000)
    except Exception:  # noqa: BLE001
        pass
    page.screenshot(path=str(ROOT / "docs" / "arena.png"), full_page=True)

    page.locator("#pd-stop").click()
    page.wait_for_function("() => (document.querySelector('#pd-race-status')||{}).innerText?.includes('Stopped')",
                           timeout=60_000)
    final = [page.locator(f"#pd-col-{i} .pd-col").get_attribute("data-status") for i in range(len(COLS))]
    assert set(final) <= {"stopped", "done"} and "stopped" in final, final
    runs = store.list_runs(kind="race")
    assert runs and runs[0]["status"] == "interrupted"
    assert all(r["n_tokens"] < 480 for r in store.get_results(runs[0]["id"]))

    # Eval sets: upload a valid JSONL, see it stored and previewed
    page.get_by_role("tab", name="Eval sets").click()
    f = tmp_path / "browser-set.jsonl"
    f.write_text("\n".join(json.dumps({"id": f"b{i}", "prompt": f"Question number {i}?", "category": "qa"})
                           for i in range(3)) + "\n", encoding="utf-8")
    page.locator("#pd-upload input[type=file]").set_input_files(str(f))
    page.wait_for_function("() => (document.querySelector('#pd-upload-msg')||{}).innerText?.includes('Stored eval set')")
    page.wait_for_function("() => (document.querySelector('#pd-preview')||{}).innerText?.includes('Question number 2?')")
    assert any(s["name"] == "browser-set" and s["n_items"] == 3 for s in store.list_eval_sets())

    # Dashboard: show the charts
    page.get_by_role("tab", name="Dashboard").click()
    page.locator("#pd-dash-show").click()
    page.wait_for_selector("#pd-plot-speedup .js-plotly-plot", timeout=60_000)
    page.wait_for_selector("#pd-plot-latency .js-plotly-plot", timeout=60_000)
    assert page.locator("#pd-plot-speedup").inner_text().count("Speed-up") >= 1
    # the sweep and long-context charts render too; with only races stored they say what would fill them
    page.wait_for_selector("#pd-plot-sweep .js-plotly-plot", timeout=60_000)
    assert "no parameter sweep" in page.locator("#pd-plot-sweep").inner_text()
    assert "no long-context results" in page.locator("#pd-plot-lc-heatmap").inner_text()
    assert page.locator("#pd-dash-sweep").is_visible()
