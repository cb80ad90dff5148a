"""Quality of Skeleton-of-Thought's answers against `ar`'s, judged without a GPT-4 judge.

    python evals/sot_quality.py --db data/bench.db --run RUN [--strategies sot,sot-r] [--out docs/bench/sot_quality.md]

Reads one stored bench run that holds `ar` and SoT rows for the same items and reports, per strategy:
  * ROUGE-L against ar's answer (`paradec.quality.rouge_l`);
  * point coverage: the share of ar's list points that the SoT answer covers (`paradec.quality.point_coverage`);
  * answer length in tokens against ar's;
  * a pairwise judgement by the engine's own model - but only after measuring whether that judge can be trusted.

The judge reads "Question / Answer A / Answer B / which is better, A or B?" and its verdict is the probability
of the next token "A" against "B" (one forward pass, no sampling). Every pair is judged in both orders. Its
reliability is measured first, on control pairs whose better side is known, built from the run's own ar answers:
  * ar's answer against the same answer cut to its first quarter of lines (the full answer is better);
  * ar's answer against ar's answer to another question of the run (the on-topic answer is better).
Control accuracy = the share of ordered judgements that pick the known-better side; position consistency = the
share of pairs whose two orders agree. The SoT-vs-ar verdicts are reported as "trusted" only when control
accuracy >= 0.8 and consistency >= 0.7; otherwise the figures are printed with the measurement that shows why
they are not used.

Nothing in the database is changed. The report is Markdown (stdout, and --out when given).

    python evals/sot_quality.py --db data/bench.db --run RUN --routes docs/bench/default-sotr-routes.json

writes instead, per category of the run, how many of sot-r's answers went to sot and how many to ar (the route
sot-r records in each result's meta), as JSON.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from paradec.quality import list_points, point_coverage, rouge_l  # noqa: E402

TRUST_ACCURACY, TRUST_CONSISTENCY = 0.8, 0.7
JUDGE_USER = ("Question: {q}\n\nAnswer A:\n{a}\n\nAnswer B:\n{b}\n\n"
              "Which answer is more helpful, complete and correct for the question? Reply with one letter: A or B.")


class Judge:
    """P(first answer is better) from the model's next-token probabilities of "A" against "B"."""

    def __init__(self, engine, max_answer_tokens: int = 400):
        self.engine = engine
        tok = engine.tokenizer
        self.a = tok.encode("A", add_special_tokens=False)[0]
        self.b = tok.encode("B", add_special_tokens=False)[0]
        self.max_answer_tokens = max_answer_tokens
        self.passes = 0

    def _clip(self, text: str) -> str:
        ids = self.engine.tokenizer.encode(text, add_special_tokens=False)
        return text if len(ids) <= self.max_answer_tokens else self.engine.decode(ids[:self.max_answer_tokens])

    def p_first(self, question: str, first: str, second: str) -> float:
        msg = JUDGE_USER.format(q=question, a=self._clip(first), b=self._clip(second))
        ids = self.engine.encode_messages([{"role": "user", "content": msg}])
        logits = self.engine.forward(ids, logits_to_keep=1)[0, -1]
        self.passes += 1
        two = torch.stack([logits[self.a], logits[self.b]]).softmax(0)
        return float(two[0])

    def both_orders(self, question: str, x: str, y: str) -> tuple[float, float]:
        """(P(x better) with x shown first, P(x better) with x shown second)."""
        return self.p_first(question, x, y), 1.0 - self.p_first(question, y, x)


def first_quarter(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return "\n".join(lines[:max(1, len(lines) // 4)])


def reliability(judge: Judge, items: list[dict]) -> dict:
    """Control pairs from the ar answers: {accuracy, consistency, pairs}."""
    right, ordered, agree, pairs = 0, 0, 0, 0
    for i, it in enumerate(items):
        q, full = it["question"], it["ar"]
        worse_ones = []
        if len([ln for ln in full.splitlines() if ln.strip()]) >= 4:
            worse_ones.append(first_quarter(full))
        if len(items) > 1:
            worse_ones.append(items[(i + 1) % len(items)]["ar"])
        for worse in worse_ones:
            p1, p2 = judge.both_orders(q, full, worse)
            right += (p1 > 0.5) + (p2 > 0.5)
            ordered += 2
            agree += (p1 > 0.5) == (p2 > 0.5)
            pairs += 1
    return {"accuracy": right / ordered if ordered else float("nan"),
            "consistency": agree / pairs if pairs else float("nan"), "pairs": pairs}


def load_items(db: str, run_id: int, strategies: list[str]) -> tuple[list[dict], dict]:
    from paradec.store import Store
    st = Store(db)
    run = st.get_run(run_id)
    if run is None:
        raise SystemExit(f"no run {run_id} in {db}")
    rows = [r for r in st.get_results(run_id) if not r.get("error")]
    by = {}
    for r in rows:
        by.setdefault((r["item_key"], r["turn"]), {})[r["strategy"]] = r
    items = []
    for key, d in sorted(by.items()):
        if "ar" not in d:
            continue
        it = {"key": key[0], "question": d["ar"]["prompt"], "ar": d["ar"]["text"], "ar_tokens": d["ar"]["n_tokens"]}
        for s in strategies:
            if s in d:
                it[s] = d[s]["text"]
                it[s + "_tokens"] = d[s]["n_tokens"]
        items.append(it)
    return items, run


def routes(db: str, run_id: int, strategy: str = "sot-r") -> dict:
    """{category: {"sot": n, "ar": n}} from the route each `strategy` result recorded: every generation counts,
    so a conversation's turns, each routed on its own text, count one each."""
    from paradec.store import Store
    out: dict = {}
    for r in Store(db).get_results(run_id):
        if r["strategy"] == strategy and not r.get("error"):
            route = (r.get("meta") or {}).get("route")
            if route:
                c = out.setdefault(r["category"], {"sot": 0, "ar": 0})
                c[route] = c.get(route, 0) + 1
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", default="data/bench.db")
    ap.add_argument("--run", type=int, required=True, help="a bench run holding ar and the SoT strategies")
    ap.add_argument("--strategies", default="sot,sot-r")
    ap.add_argument("--model", default=None, help="judge model (default: the default model)")
    ap.add_argument("--no-judge", action="store_true", help="skip the pairwise judgement")
    ap.add_argument("--out", default=None)
    ap.add_argument("--routes", default=None, help="write sot-r's routes per category of the run to this JSON file")
    args = ap.parse_args(argv)
    if args.routes:
        rt = routes(args.db, args.run)
        Path(args.routes).parent.mkdir(parents=True, exist_ok=True)
        Path(args.routes).write_text(json.dumps(rt, indent=1) + "\n", encoding="utf-8")
        print(json.dumps(rt))
        return 0
    strategies = [s for s in args.strategies.split(",") if s]
    items, run = load_items(args.db, args.run, strategies)
    if not items:
        raise SystemExit(f"run {args.run} has no ar results")
    lines = [f"SoT quality against `ar`, bench run {args.run} ({run.get('name') or ''}), {len(items)} items; "
             f"`python evals/sot_quality.py --db {args.db} --run {args.run}`", ""]
    judge = rel = None
    if not args.no_judge:
        from paradec.engine import Engine
        engine = Engine.load(args.model)
        judge = Judge(engine)
        rel = reliability(judge, items)
        trusted = rel["accuracy"] >= TRUST_ACCURACY and rel["consistency"] >= TRUST_CONSISTENCY
        lines += [f"Judge: {engine.name} itself. Reliability on {rel['pairs']} control pairs (full answer vs its "
                  f"first quarter; on-topic vs another question's answer), each judged in both orders: accuracy "
                  f"**{rel['accuracy']:.2f}**, position consistency **{rel['consistency']:.2f}** "
                  f"(trusted when >= {TRUST_ACCURACY} and >= {TRUST_CONSISTENCY}: "
                  f"**{'trusted' if trusted else 'NOT trusted; its verdicts below are not used'}**).", ""]
    lines += ["| strategy | items | ROUGE-L vs ar | point coverage of ar | answer tokens ÷ ar's | judge: preferred "
              "over ar (both orders agree) | judge: mean P(better than ar) |", "|---|---|---|---|---|---|---|"]
    for s in strategies:
        its = [it for it in items if s in it]
        if not its:
            continue
        rl = [rouge_l(it[s], it["ar"]) for it in its]
        cov = [c for c in (point_coverage(it[s], it["ar"]) for it in its) if c is not None]
        ratio = sum(it[s + "_tokens"] for it in its) / max(1, sum(it["ar_tokens"] for it in its))
        wins, meanp = "–", "–"
        if judge is not None:
            ps = [judge.both_orders(it["question"], it[s], it["ar"]) for it in its]
            agree_win = sum(p1 > 0.5 and p2 > 0.5 for p1, p2 in ps)
            agree_loss = sum(p1 < 0.5 and p2 < 0.5 for p1, p2 in ps)
            wins = f"{agree_win} won, {agree_loss} lost, {len(ps) - agree_win - agree_loss} split"
            meanp = f"{sum(p1 + p2 for p1, p2 in ps) / (2 * len(ps)):.2f}"
        lines.append(f"| {s} | {len(its)} | {sum(rl) / len(rl):.3f} | "
                     f"{(sum(cov) / len(cov)) if cov else float('nan'):.2f} (of {len(cov)} with a list) | "
                     f"{ratio:.2f} | {wins} | {meanp} |")
    lines += ["", f"ar's answers with a list of >= 2 points: {sum(len(list_points(it['ar'])) >= 2 for it in items)} "
              f"of {len(items)}." + (f" Judge forward passes: {judge.passes}." if judge else "")]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
