"""Model cards written from the training run that produced the model, plus format-following rates.

The rates are measured on modules held out of training (corpus.is_held_out), greedy decoding:
  * docstring answers in format: "What does `X` do?" answered with prose - ended by EOS within 120 tokens,
    at least 3 words, not a numbered list, no code fence - and ROUGE-L against the real docstring paragraph;
  * outlines: "Outline the module `M`." answered with a numbered list of at least 3 points.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from . import corpus as C

N_DOC_QUESTIONS = 30


def held_out_questions(limit: int = N_DOC_QUESTIONS):
    corp = C.build_corpus()
    docs, outlines = [], []
    for mod in corp.val_modules:
        for q, _s, d in mod.members:
            docs.append((q, C.first_paragraph(d)))
        if C.outline_points(mod):
            outlines.append(mod.name)
    step = max(1, len(docs) // limit)
    return docs[::step][:limit], outlines


def numbered_points(text: str) -> list[str]:
    return re.findall(r"^\s*\d+[.)]\s*(\S.*)$", text, flags=re.M)


def format_rates(engine, limit: int = N_DOC_QUESTIONS) -> dict:
    from ..quality import rouge_l
    from ..race import run_alone
    from ..strategies import Request
    docs, outlines = held_out_questions(limit)
    outlines = outlines[:limit]
    ok_doc, rouge = 0, []
    for q, ref in docs:
        lane = run_alone(engine, "ar", Request(prompt=C.docstring_question(q), max_new_tokens=120))
        t = lane.text.strip()
        if (lane.finish_reason == "eos" and len(t.split()) >= 3 and not numbered_points(t) and "```" not in t):
            ok_doc += 1
        rouge.append(rouge_l(t, ref))
    ok_out, npoints = 0, []
    for m in outlines:
        lane = run_alone(engine, "ar", Request(prompt=C.outline_question(m), max_new_tokens=160))
        pts = numbered_points(lane.text)
        npoints.append(len(pts))
        ok_out += len(pts) >= 3
    return {"docstring_questions": len(docs), "docstring_in_format": ok_doc,
            "docstring_in_format_rate": ok_doc / max(1, len(docs)),
            "docstring_rouge_l_mean": sum(rouge) / max(1, len(rouge)),
            "outline_requests": len(outlines), "outline_3plus_points": ok_out,
            "outline_3plus_rate": ok_out / max(1, len(outlines)),
            "outline_points_mean": sum(npoints) / max(1, len(npoints))}


def write_card(model_dir: Path, command: str, rates: dict | None = None) -> Path:
    model_dir = Path(model_dir)
    s = json.loads((model_dir / "training_summary.json").read_text())
    if rates is not None:
        s["format_rates"] = rates
        (model_dir / "training_summary.json").write_text(json.dumps(s, indent=1))
    cfg, arch = s["config"], s["arch"]
    hist = s["history"]
    curve = ", ".join(f"{h['step']}: {h['loss']:.2f}" for h in hist[:: max(1, len(hist) // 8)])
    lines = [
        f"# {s['name']}",
        "",
        "A small Llama-architecture causal language model trained from scratch by paradec, so that the workbench "
        "runs with no network. It is a toy for measuring decoding strategies, not a useful assistant.",
        "",
        "| | |", "|---|---|",
        f"| parameters | {s['parameters']:,} |",
        f"| architecture | Llama: hidden {arch['hidden_size']}, {arch['num_hidden_layers']} layers, "
        f"{arch['num_attention_heads']} heads, MLP {arch['intermediate_size']}, tied embeddings, RoPE |",
        f"| context length | {arch['max_position_embeddings']} tokens |",
        f"| tokenizer | byte-level BPE, {s['vocab_size']:,} tokens, trained on the same corpus; chat template "
        "`<\\|user\\|>` / `<\\|assistant\\|>` / `<\\|end\\|>` |",
        f"| training data | Python {s['python']} standard library source (tests and idlelib left out), pydoc "
        "topics, and chat examples derived mechanically from docstrings (see paradec/training/corpus.py); "
        f"{s['corpus_tokens']['train_raw']:,} raw + {s['corpus_tokens']['train_chat']:,} chat tokens; 1 module "
        f"in {C.HELD_OUT_EVERY} held out |",
        f"| training | {cfg['steps']} steps × {cfg['batch_size']} × {cfg['seq_len']} tokens = "
        f"{s['train_tokens_seen']:,} tokens, AdamW lr {cfg['lr']} (warm-up {cfg['warmup']}, cosine), "
        f"chat fraction {cfg['chat_fraction']}, seed {cfg['seed']} |",
        f"| validation perplexity | {s['val_ppl_raw']:.2f} on held-out raw text, {s['val_ppl_chat']:.2f} on "
        "held-out chat examples |",
        f"| training time | {s['train_time_s'] / 60:.1f} min of compute (checkpoint writes excluded) |",
        f"| hardware | {s['hardware']}{'. ' + s['note'] if s.get('note') else ''} |",
        f"| software | torch {s['torch']}, Python {s['python']} |",
        f"| command | `{command}` |",
        "",
        f"Loss by step: {curve}.",
        "",
    ]
    r = s.get("format_rates")
    if r:
        lines += [
            "## Format following (held-out modules, greedy)", "",
            f"- Docstring questions answered in format (prose, ended by EOS within 120 tokens): "
            f"{r['docstring_in_format']}/{r['docstring_questions']} = {r['docstring_in_format_rate']:.0%}; "
            f"mean ROUGE-L against the real docstring {r['docstring_rouge_l_mean']:.3f}.",
            f"- Outline requests answered with a numbered list of at least 3 points: "
            f"{r['outline_3plus_points']}/{r['outline_requests']} = {r['outline_3plus_rate']:.0%} "
            f"(mean {r['outline_points_mean']:.1f} points).", "",
        ]
    lines += ["## Limits", "",
              "Trained for about an hour on two CPU cores: it writes Python-looking text and follows the three chat "
              "formats above; its answers are often wrong. Use it to compare decoding strategies, not to answer "
              "questions."]
    out = model_dir / "README.md"
    out.write_text("\n".join(lines) + "\n")
    return out
