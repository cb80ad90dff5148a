"""Eval-set uploads: every malformed kind is refused with the row and the problem, and nothing is stored."""
import ast
import json
import re

import pytest

from evals import make_suites as M
from paradec import evalsets
from paradec.evalsets import EvalSetError, builtin_suites, load_eval_set, load_suite
from paradec.store import Store

EMPTY = {"runs": 0, "eval_sets": 0, "eval_items": 0, "results": 0}


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "e.db")
    yield s
    s.close()


@pytest.fixture(autouse=True)
def _store_starts_empty(store):
    assert store.counts() == EMPTY


def upload(store, data, filename, **kw):
    """What the app does with an upload: parse, then save."""
    parsed = load_eval_set(data, filename, **kw)
    return store.save_eval_set(parsed)


def refused(store, data, filename, *expected, **kw) -> EvalSetError:
    before = store.counts()
    with pytest.raises(EvalSetError) as e:
        upload(store, data, filename, **kw)
    msg = str(e.value)
    assert msg.startswith(filename.rsplit("/", 1)[-1] + ":"), msg
    for part in expected:
        assert part in msg, f"{part!r} not in {msg!r}"
    assert store.counts() == before
    return e.value


def test_bad_encoding(store):
    data = "prompt\nhello\n".encode() + b"caf\xe9 latin-1\n"
    refused(store, data, "set.csv", "line 3", "not valid UTF-8")


def test_invalid_json_line(store):
    data = b'{"prompt": "ok"}\n{"prompt": "broken",}\n{"prompt": "fine"}\n'
    err = refused(store, data, "set.jsonl", "line 2", "invalid JSON")
    assert len(err.errors) == 1


def test_missing_prompt_column(store):
    refused(store, b"id,question\n1,What?\n", "set.csv", "line 1", "missing column `prompt`", "'question'")


def test_missing_prompt_key(store):
    data = b'{"prompt": "a"}\n{"question": "b"}\n'
    refused(store, data, "set.jsonl", "line 2", "missing key `prompt`")


def test_empty_prompt_csv_row(store):
    data = b'id,prompt\na,"first"\nb,"  "\n'
    refused(store, data, "set.csv", "row 2 (line 3)", "empty prompt")


def test_empty_prompt_jsonl(store):
    refused(store, b'{"prompt": "x"}\n\n{"prompt": ""}\n', "set.jsonl", "line 3", "empty prompt")


def test_non_text_prompt(store):
    refused(store, b'{"prompt": ["a"]}\n', "set.jsonl", "line 1", "`prompt` must be text")


def test_duplicate_id(store):
    data = b'{"id": "a", "prompt": "x"}\n{"id": "b", "prompt": "y"}\n{"id": "a", "prompt": "z"}\n'
    refused(store, data, "set.jsonl", "line 3", "duplicate id 'a'", "line 1")


def test_prompt_longer_than_context(store, tiny_engine):
    tok = tiny_engine.tokenizer

    def count(text):
        return len(tok(text)["input_ids"])
    long = " ".join(["word"] * 2000)
    data = (json.dumps({"prompt": "short"}) + "\n" + json.dumps({"prompt": long}) + "\n").encode()
    refused(store, data, "set.jsonl", "line 2", "tokens", "context", f"({tiny_engine.context_length} tokens)",
            max_prompt_tokens=tiny_engine.context_length, count_tokens=count)
    # the same file loads when no limit is given
    assert len(load_eval_set(data, "set.jsonl").items) == 2


def test_oversize_file(store):
    data = b"prompt\n" + b"x" * 500 + b"\n"
    refused(store, data, "big.csv", "over the limit of 100 bytes", max_bytes=100)


def test_oversize_file_on_disk(store, tmp_path):
    p = tmp_path / "big.jsonl"
    p.write_bytes(b'{"prompt": "x"}\n' * 100)
    refused(store, p, "big.jsonl", "over the limit", max_bytes=200)


def test_empty_file(store):
    refused(store, b"", "empty.jsonl", "empty")
    refused(store, b"  \n\n", "empty.csv", "empty")


def test_header_only_csv(store):
    refused(store, b"id,prompt\n", "h.csv", "line 2", "no rows")


def test_unknown_extension(store):
    refused(store, b"prompt\nhello\n", "set.txt", "unknown file type", "'.txt'")


def test_wrong_field_count(store):
    refused(store, b"id,prompt\na,hello, world\n", "set.csv", "row 1 (line 2)", "3 fields", "header has 2")


def test_bad_reference_and_chat(store):
    refused(store, b'{"prompt": "x", "reference": 5}\n', "r.jsonl", "line 1", "`reference` must be text")
    refused(store, b'{"prompt": "x", "chat": "maybe"}\n', "c.jsonl", "line 1", "`chat` must be true or false")


def test_every_error_is_collected_and_capped(store):
    lines = [json.dumps({"prompt": "ok"})] + ["{bad"] * 80
    err = refused(store, "\n".join(lines).encode(), "many.jsonl", "line 2", "invalid JSON", "more")
    assert len(err.errors) == evalsets.MAX_ERRORS
    assert err.errors[0].startswith("line 2:") and err.errors[1].startswith("line 3:")
    mixed = b'{"prompt": ""}\n{"prompt": "fine"}\n{"x": 1}\n'
    err = refused(store, mixed, "mixed.jsonl", "2 problems")
    assert [e.split(":")[0] for e in err.errors] == ["line 1", "line 3"]


def test_csv_details(store):
    """Quoted commas and newlines, a BOM, defaults for missing id and category, the chat column."""
    data = ('\ufeffPrompt,Category,chat\n"Hello, world",greet,\n"def f(x):\n    return x\n",code,false\n'
            ',,\n"third",,yes\n').encode()
    s = load_eval_set(data, "ok.csv")
    assert s.format == "csv" and s.name == "ok"
    assert [i.item_id for i in s.items] == ["1", "2", "3"]
    assert [i.category for i in s.items] == ["greet", "code", "general"]
    assert s.items[0].prompt == "Hello, world" and s.items[1].prompt == "def f(x):\n    return x\n"
    assert [i.chat for i in s.items] == [True, False, True]
    sid = store.save_eval_set(s)
    assert [r["chat"] for r in store.get_eval_set_items(sid)] == [True, False, True]
    semi = load_eval_set(b"id;prompt\nx;hello\n", "semi.csv")
    assert semi.items[0].item_id == "x" and semi.items[0].prompt == "hello"


def test_jsonl_defaults_and_meta():
    s = load_eval_set(b'{"prompt": "a", "max_new_tokens": 64}\n{"prompt": "b", "id": 7, "reference": "r"}\n',
                      "x.jsonl")
    assert s.format == "jsonl"
    assert [i.item_id for i in s.items] == ["1", "7"] and s.items[0].category == "general"
    assert s.items[0].meta == {"max_new_tokens": 64} and s.items[1].reference == "r"
    arr = load_eval_set(b'[{"prompt": "a"}, {"prompt": "b"}]', "x.json")
    assert [i.prompt for i in arr.items] == ["a", "b"]


def test_specbench_questions(store, tmp_path):
    p = tmp_path / "question.jsonl"
    rows = [{"question_id": 81, "category": "writing",
             "turns": ["Compose a short travel note about Hawaii.", "Rewrite it starting every sentence with A."]},
            {"question_id": 101, "category": "reasoning", "turns": ["Which is larger, 9.11 or 9.9?", "Why?"],
             "reference": ["9.9 is larger.", "Compare the tenths digit first."]},
            {"question_id": 102, "category": "math", "turns": ["What is 2+2?"], "reference": ["4"]}]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    s = load_eval_set(p)
    assert s.format == "specbench" and s.name == "question"
    assert [i.item_id for i in s.items] == ["81", "101", "102"]
    assert s.items[0].turns[1] == "Rewrite it starting every sentence with A." and s.items[0].references is None
    assert s.items[1].reference_for(1) == "Compare the tenths digit first." and s.items[2].reference == "4"
    sid = store.save_eval_set(s)
    assert store.get_eval_set(sid)["format"] == "specbench"
    items = store.get_eval_set_items(sid)
    assert items[0]["prompt"] == rows[0]["turns"][0] and items[0]["turns"] == rows[0]["turns"]
    assert items[1]["references"] == rows[1]["reference"]
    refused(store, b'{"question_id": 1, "turns": []}\n', "q.jsonl", "line 1", "`turns` must be a non-empty list")
    refused(store, b'{"question_id": 1, "turns": ["a", " "]}\n', "q.jsonl", "line 1", "turn 2 is an empty prompt")


# Spec-Bench's question file gives some turns a list of acceptable references
SPECBENCH_ALTERNATIVES = [
    {"question_id": 81, "category": "qa", "turns": ["What are trees useful for?"],
     "reference": [["a source of lumber", "purifying water", "shade in summer"]]},
    {"question_id": 82, "category": "math", "turns": ["Name a prime number.", "Name the even prime."],
     "reference": [["2", "3", "5", "7"], "2"]},
    {"question_id": 83, "category": "writing", "turns": ["Write a title.", "Shorten it."],
     "reference": [None, ["Trees", "  ", "Forests"]]},
    {"question_id": 84, "category": "qa", "turns": ["Capital of France?"], "reference": [["Paris"]]},
]


def test_specbench_reference_lists_load_store_and_score_against_the_best(store, tmp_path):
    from paradec import bench as B
    from paradec import quality
    p = tmp_path / "question.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in SPECBENCH_ALTERNATIVES), encoding="utf-8")
    s = load_eval_set(p)                             # loads whole: no row is rejected
    assert [i.item_id for i in s.items] == ["81", "82", "83", "84"]
    trees, primes, titles, paris = s.items
    assert trees.reference_for(0) == ["a source of lumber", "purifying water", "shade in summer"]
    assert trees.reference == "a source of lumber"   # text: the first alternative of the first turn
    assert primes.references == [["2", "3", "5", "7"], "2"]
    assert titles.references == [None, ["Trees", "Forests"]] and titles.reference is None   # blanks dropped
    assert paris.references == ["Paris"]             # a single alternative is plain text
    # stored and read back with every alternative, as the benchmark reads it
    sid = store.save_eval_set(s)
    rows = store.get_eval_set_items(sid)
    assert rows[0]["reference"] == "a source of lumber" and rows[0]["references"] == trees.references
    assert [i.references for i in store.load_eval_set(sid).items] == [i.references for i in s.items]
    item = B.items_from_store(store, sid)[0]
    ref = item.reference_for(0)
    assert ref == trees.reference_for(0)
    # scored against the best-matching alternative, not the first
    answer = "Trees are good for purifying water."
    assert quality.rouge_l(answer, ref) == quality.rouge_l(answer, "purifying water")
    assert quality.rouge_l(answer, ref) > quality.rouge_l(answer, "a source of lumber") + 0.3
    q = quality.quality_row(answer, reference=ref)
    assert q["rouge_l_vs_ref"] == quality.rouge_l(answer, "purifying water")
    assert q["bleu_vs_ref"] == quality.bleu(answer, "purifying water") and q["contains_ref"] == 1.0


def test_malformed_reference_entries_are_row_errors(store):
    bad = (b'{"question_id": 1, "turns": ["a"], "reference": [[1, "x"]]}\n'
           b'{"question_id": 2, "turns": ["b"], "reference": [{"text": "y"}]}\n'
           b'{"question_id": 3, "turns": ["c"], "reference": [[["nested"]]]}\n'
           b'{"question_id": 4, "turns": ["d"], "reference": ["ok"]}\n')
    err = refused(store, bad, "q.jsonl", "3 problems", "line 1", "reference for turn 1 must be text or a list "
                  "of texts", "got int")
    assert [e.split(":")[0] for e in err.errors] == ["line 1", "line 2", "line 3"]
    assert "got dict" in err.errors[1] and "got list" in err.errors[2]
    refused(store, b'{"turns": ["a", "b"], "reference": ["x", ["y"], "z"]}\n', "q.jsonl", "line 1",
            "3 entries", "2 turn(s)")
    refused(store, b'{"prompt": "x", "reference": {"a": 1}}\n', "r.jsonl", "line 1", "`reference` must be text",
            "got dict")


def test_samples_load():
    for name, fmt in (("sample.csv", "csv"), ("sample.jsonl", "jsonl"), ("question.jsonl", "specbench")):
        s = load_eval_set(evalsets.SAMPLES_DIR / name)
        assert s.format == fmt and 3 <= len(s.items) <= 5


# suite -> category; every built-in suite but longcontext is chat prompts for an instruction-tuned model
EXPECTED = {"conversation": "conversation", "translation": "translation", "summarization": "summarization",
            "qa": "qa", "math": "math", "rag": "rag", "code": "code", "code-edit": "code-edit", "lists": "lists",
            "longcontext": "longcontext"}
WITH_REFERENCES = ("translation", "summarization", "qa", "math", "rag", "code", "longcontext")


def test_builtin_suites_load():
    suites = builtin_suites()
    assert set(suites) == set(EXPECTED), "the old paradec-tiny suites are gone; every suite is listed here"
    for name, cat in EXPECTED.items():
        s = load_suite(name)
        assert len(s.items) >= 30, name
        assert {i.category for i in s.items} == {cat}, name
        assert len({i.item_id for i in s.items}) == len(s.items)
        if name != "longcontext":
            assert all(i.chat for i in s.items), name
        if name in WITH_REFERENCES:
            assert all(evalsets.alternatives(i.reference_for(0)) for i in s.items), name
    assert not any(i.references for n in ("conversation", "lists") for i in load_suite(n).items)
    with pytest.raises(EvalSetError, match="unknown suite"):
        load_suite("nope")


def test_chat_suites_fit_the_default_models_window():
    """Prompt + 256 new tokens per turn fits 2048 tokens (the estimate make_suites checks, ASCII at ~3.6
    characters per token and every other character a token)."""
    for name in EXPECTED:
        if name == "longcontext":
            continue
        for it in load_suite(name).items:
            need = sum(M.estimated_tokens(t) for t in it.turns) + (M.NEW_TOKENS + 30) * len(it.turns)
            assert need <= M.CONTEXT, (name, it.item_id, need)


def test_chat_suites_fit_2048_tokens_under_the_default_models_chat_template():
    """Exact count: every turn's chat-templated prompt (earlier answers taken as 256 tokens each) + 256 new."""
    from transformers import AutoTokenizer

    from paradec.provision import ensure_default      # provisioned on first use, as a user's first run does
    tok = AutoTokenizer.from_pretrained(str(ensure_default()))
    for name in EXPECTED:
        if name == "longcontext":
            continue
        for it in load_suite(name).items:
            msgs = [{"role": "user", "content": t} for t in it.turns]
            ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
            n = len(ids["input_ids"] if hasattr(ids, "keys") else ids)
            assert n + M.NEW_TOKENS * len(it.turns) <= M.CONTEXT, (name, it.item_id, n)


def test_conversation_suite_is_multi_turn(store):
    s = load_suite("conversation")
    assert s.format == "specbench" and all(len(i.turns) >= 2 for i in s.items)
    assert sum(len(i.turns) >= 3 for i in s.items) >= 3
    sid = store.save_eval_set(s)
    assert [r["turns"] for r in store.get_eval_set_items(sid)] == [i.turns for i in s.items]


def test_translation_and_qa_references_keep_their_alternatives():
    tr = load_suite("translation")
    langs = {(i.meta["source_language"], i.meta["target_language"]) for i in tr.items}
    assert {("English", "French"), ("English", "German"), ("English", "Spanish"), ("French", "English")} <= langs
    into_english = [i for i in tr.items if i.meta["target_language"] == "English"]
    assert into_english and all(len(evalsets.alternatives(i.reference_for(0))) == 2 for i in into_english)
    assert all(isinstance(i.reference, str) and i.reference in evalsets.alternatives(i.reference_for(0))
               for i in tr.items)
    qa = load_suite("qa")
    assert sum(isinstance(i.reference_for(0), list) for i in qa.items) >= 3


def test_math_references_are_the_final_answers():
    s = load_suite("math")
    assert len({i.meta["template"] for i in s.items}) >= 10
    for it in s.items:
        assert it.reference == str(it.meta["answer"]) and int(it.reference) > 0
        assert "final answer" in it.prompt
    # the change problems: the reference is the arithmetic of the numbers in the prompt
    for it in (i for i in s.items if i.meta["template"] == "change"):
        p, n, b = (int(x) for x in re.findall(r"\d+", it.prompt)[:3])
        assert int(it.reference) == b * 100 - p * n


def test_code_references_pass_their_tests():
    s = load_suite("code")
    hand = [i for i in s.items if i.meta["source"] == "handwritten"]
    assert len(hand) >= 20 and len(s.items) - len(hand) >= 6
    ran = 0
    for it in hand:
        ns: dict = {}
        exec(compile(it.reference, it.item_id, "exec"), ns)
        if it.meta["tests"]:
            exec(compile(it.meta["tests"], it.item_id + "-tests", "exec"), ns)
            ran += 1
    assert ran >= 18
    for it in s.items:
        if it.meta["source"] != "handwritten":            # a stdlib function to complete from its head
            head = it.prompt.split("```python\n", 1)[1].rsplit("\n```", 1)[0]
            assert it.reference.startswith(head) and ast.parse(it.reference)


def test_code_edit_references_are_the_edit():
    s = load_suite("code-edit")
    tasks = [i.meta["task"] for i in s.items]
    assert {t: tasks.count(t) for t in set(tasks)} == {"rename": 9, "remove-comments": 9, "remove-docstring": 9,
                                                       "type-hints": 9}
    for it in s.items:
        src = it.prompt.split("```python\n", 1)[1].rsplit("\n```", 1)[0]
        if it.meta["task"] == "type-hints":
            assert it.reference is None
            continue
        ref, fn = it.reference, ast.parse(it.reference).body[0]
        if it.meta["task"] == "rename":
            old, new = it.meta["renamed"], it.meta["new_name"]
            assert f"`{old}` to `{new}`" in it.prompt
            assert {a.arg for a in fn.args.args + fn.args.kwonlyargs + fn.args.posonlyargs} >= {new}
            assert not any(isinstance(n, ast.Name) and n.id == old for n in ast.walk(fn))
        else:
            # input-grounded: every line of the answer is a line of the prompt (less a trailing comment)
            lines = src.splitlines()
            assert all(ln in lines or any(x.startswith(ln) and x[len(ln):].lstrip().startswith("#") for x in lines)
                       for ln in ref.splitlines())
            if it.meta["task"] == "remove-comments":
                assert "#" in src and "#" not in ref and ast.dump(ast.parse(ref)) == ast.dump(ast.parse(src))
            else:
                assert ast.get_docstring(ast.parse(src).body[0]) and ast.get_docstring(fn) is None


def test_rag_and_summarization_are_grounded():
    rag = load_suite("rag")
    assert {i.meta.get("task") for i in rag.items} >= {"what", "which"}
    for it in rag.items:
        assert it.prompt.startswith(M.RAG_INSTRUCTION) and "\n\nQuestion: " in it.prompt
        if it.meta["source"] != "handwritten":          # the answer is the cited document's text
            k, qual = it.meta["document"], it.meta["source"]
            doc = it.prompt.split(f"[{k}] `{qual}`: ", 1)[1].split("\n\n", 1)[0]
            alts = evalsets.alternatives(it.reference_for(0))
            assert alts[0] == f"{doc} [{k}]" or alts[-1] == f"`{qual}` [{k}]: {doc}"
    summ = load_suite("summarization")
    for it in summ.items:
        assert f"`{it.meta['source']}`" in it.prompt and it.reference not in it.prompt     # the summary is held back


def test_make_suites_rewrites_identical_files():
    """`python -m evals.make_suites` is reproducible: regenerating the chat suites gives the files as committed."""
    for name, fn in M.SUITES.items():
        if name == "longcontext":
            continue
        lines = [json.dumps(it, ensure_ascii=False) for it in fn()]
        assert lines == builtin_suites()[name].read_text(encoding="utf-8").splitlines(), name


def test_longcontext_suite():
    """Rebuilt for the default model: chat prompts sized by its tokenizer (make_suites counts them with the chat
    template), passkey controls and 2x-16x a 512-token window at four depths, key-value retrieval, document QA."""
    lc = load_suite("longcontext")
    meta = [i.meta for i in lc.items]
    keys = [i for i in lc.items if i.meta["task"] == "passkey"]
    assert len(keys) == 20 and {i.meta["approx_tokens"] for i in keys} == {384, 1024, 2048, 4096, 8192}
    assert sum(bool(i.meta["control"]) for i in keys) == 4
    for it in keys:
        assert it.chat and it.reference.isdigit() and len(it.reference) == 5 and it.reference in it.prompt
        pos = it.prompt.index(it.reference) / len(it.prompt)
        assert abs(pos - it.meta["depth_percent"] / 100) < 0.08
        assert 0.97 * it.meta["approx_tokens"] <= it.meta["tokens"] <= it.meta["approx_tokens"]
    for it in (i for i in lc.items if i.meta["task"] == "kv"):
        assert f'"{it.meta["key"]}": "{it.reference}"' in it.prompt and it.prompt.count(f'"{it.meta["key"]}"') == 2
    for it in (i for i in lc.items if i.meta["task"] == "section_number"):
        n = int(it.reference)
        name = it.prompt.rsplit("`", 2)[1]
        assert f"Section {n}: `{name}`" in it.prompt
    for it in (i for i in lc.items if i.meta["task"] == "name_lookup"):
        assert f"Section {it.meta['section']}: `{it.reference}`" in it.prompt
    assert {m["task"] for m in meta} == {"passkey", "kv", "section_number", "name_lookup"}
