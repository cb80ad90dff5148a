"""Quality metrics on known strings, and perplexity against transformers' own loss."""
import math

import pytest
import torch

from paradec.quality import (alternatives, list_points, point_coverage, best_reference, bleu, contains, exact_match, first_divergence, perplexity,
                             quality_row, rouge_l)

REF = "Return a new list containing all items from the iterable in ascending order."


def test_rouge_l():
    assert rouge_l(REF, REF) == 1.0
    assert rouge_l("completely unrelated words here", REF) == 0.0
    partial = rouge_l("Return a list of the items in ascending order.", REF)
    assert 0.3 < partial < 1.0
    # LCS: order matters, the same bag of words reversed scores lower
    assert rouge_l(" ".join(reversed(REF.split())), REF) < 0.5
    assert rouge_l("anything", None) is None
    assert rouge_l("", REF) == 0.0 and rouge_l("", "") == 1.0
    # case and punctuation do not count; underscores split identifiers like rouge_score's own tokenizer
    assert rouge_l("RETURN a new list, containing all items from the iterable in ascending order", REF) == 1.0
    assert rouge_l("read_config", "read config") == 1.0
    # non-Latin text is scored, not thrown away
    assert rouge_l("привет мир", "привет мир") == 1.0 and rouge_l("привет", "мир") == 0.0


def test_bleu():
    assert bleu(REF, REF) == pytest.approx(100.0)
    assert bleu("completely unrelated words here", REF) == 0.0
    partial = bleu("Return a new list containing all items from the iterable in descending order.", REF)
    assert 20.0 < partial < 100.0
    assert bleu("x", None) is None and bleu("", REF) == 0.0


def test_exact_match_and_mismatch():
    assert exact_match([1, 2, 3], [1, 2, 3]) == 1.0
    assert exact_match([1, 2, 3], [1, 2, 4]) == 0.0
    assert exact_match([1, 2], [1, 2, 3]) == 0.0
    assert exact_match([1], None) is None
    assert first_divergence([1, 2, 3], [1, 2, 4]) == 2 and first_divergence([1, 2], [1, 2, 3]) == 2
    assert first_divergence([5], [5]) is None


def test_contains_and_quality_row():
    assert contains("The pass key is 48213.", "48213") == 1.0 and contains("no idea", "48213") == 0.0
    q = quality_row("the cat sat", [1, 2, 3], ar_text="the cat sat", ar_ids=[1, 2, 3], reference="a dog ran")
    assert q["exact_match"] == 1.0 and q["rouge_l_vs_ar"] == 1.0 and q["bleu_vs_ar"] == pytest.approx(100)
    assert q["rouge_l_vs_ref"] == 0.0 and q["contains_ref"] == 0.0 and "first_mismatch" not in q
    q = quality_row("the cat ran", [1, 2, 9], ar_text="the cat sat", ar_ids=[1, 2, 3])
    assert q["exact_match"] == 0.0 and q["diverges_at"] == 2 and "rouge_l_vs_ref" not in q


def test_a_list_of_references_scores_against_the_best_match():
    """Spec-Bench lists acceptable answers per turn: each metric uses the best-matching one, wherever it is."""
    refs = ["a source of lumber", "purifying water", "shade in summer"]
    answer = "Trees help by purifying water."
    assert best_reference(answer, refs) == "purifying water"
    assert rouge_l(answer, refs) == rouge_l(answer, "purifying water") > rouge_l(answer, refs[0])
    assert bleu(answer, refs) == bleu(answer, "purifying water")
    assert contains("it gives shade in summer", refs) == 1.0 and contains("nothing", refs) == 0.0
    q = quality_row(answer, reference=refs)
    assert q["rouge_l_vs_ref"] == rouge_l(answer, "purifying water")
    # the order of the alternatives does not matter; a tie goes to the first; one alternative is plain text
    assert rouge_l(answer, list(reversed(refs))) == rouge_l(answer, refs)
    assert best_reference("zzz", refs) == refs[0] and best_reference(answer, ["only"]) == "only"
    assert rouge_l(answer, ("purifying water",)) == rouge_l(answer, "purifying water")
    assert alternatives(None) == [] and alternatives("x") == ["x"] and alternatives(("a", None, "b")) == ["a", "b"]
    assert rouge_l(answer, []) is None and bleu(answer, []) is None and contains(answer, []) is None
    assert best_reference(None, refs) is None


def test_perplexity(tiny_engine):
    eng = tiny_engine
    prompt = eng.tokenizer("def read_config(path):", add_special_tokens=True)["input_ids"]
    out = eng.tokenizer("\n    return open(path).read()", add_special_tokens=False)["input_ids"]
    ppl = perplexity(eng, prompt, out)
    assert ppl is not None and math.isfinite(ppl) and ppl > 1.0
    # independent peer: transformers' own loss with the prompt positions masked out
    ids = torch.tensor([prompt + out])
    labels = ids.clone()
    labels[0, :len(prompt)] = -100
    with torch.no_grad():
        loss = eng.model(input_ids=ids, labels=labels).loss.item()
    assert ppl == pytest.approx(math.exp(loss), rel=1e-4)
    # the model's own greedy continuation is more likely than a random one
    greedy, ids_ = [], list(prompt)
    for _ in range(len(out)):
        nxt = int(eng.forward(ids_)[0, -1].argmax())
        greedy.append(nxt)
        ids_.append(nxt)
    assert perplexity(eng, prompt, greedy) < ppl
    # empty outputs are not a crash
    assert perplexity(eng, prompt, []) is None
    assert perplexity(eng, [], out[:1]) is None
    assert math.isfinite(perplexity(eng, [], out))


def test_perplexity_longer_than_context(tiny_engine):
    eng = tiny_engine
    prompt = list(range(10, 10 + eng.context_length))         # already fills the whole context
    out = [42, 43, 44]
    ppl = perplexity(eng, prompt, out)
    assert ppl is not None and math.isfinite(ppl) and ppl > 1.0


def test_point_coverage_counts_the_reference_points_the_candidate_covers():
    ar = ("Exercise helps in many ways:\n\n1. **Better heart health**: it lowers blood pressure.\n"
          "2. **Weight control**: it burns calories.\n3. **Mood**: it releases endorphins.\n\nIn short, move.")
    assert list_points(ar) == ["Better heart health: it lowers blood pressure.", "Weight control: it burns calories.",
                               "Mood: it releases endorphins."]
    sot = "1. Heart health. It strengthens the heart.\n2. Mood improvement: exercise lifts the mood.\n3. Sleep."
    assert point_coverage(sot, ar) == pytest.approx(2 / 3)          # weight control is missing
    assert point_coverage(ar, ar) == 1.0
    assert point_coverage("Nothing relevant here.", ar) == 0.0
    assert point_coverage(sot, "A prose answer without a list.") is None   # nothing to cover
    assert point_coverage(None, ar) == 0.0
    bullets = "- Better heart health\n- Weight control\n* Mood"
    assert point_coverage(bullets, ar) == 1.0


def test_code_checks_parse_run_and_time_out():
    from paradec.quality import code_checks, code_of
    assert code_of("text\n```py\nx = 1\n```\n```python\ny = 2\n```") == "x = 1\n"
    assert code_of("```\nz = 3\n```") == "z = 3\n"
    assert code_of("def f():\n    return 1\n") == "def f():\n    return 1\n"      # no fence: the whole text
    assert code_of("```python\ndef f():\n    return 1\n") == "def f():\n    return 1\n"  # unclosed (cut off)
    assert code_checks("def f(:\n") == {"code_parses": False}
    assert code_checks("") == {"code_parses": False}
    assert code_checks("def f():\n    return 1\n", "assert f() == 1") == {"code_parses": True, "passes_tests": True}
    assert code_checks("def f():\n    return 2\n", "assert f() == 1")["passes_tests"] is False
    # an answer that never ends is stopped, and fails
    assert code_checks("def f():\n    while True:\n        pass\n", "f()", timeout=1)["passes_tests"] is False
    # the answer runs isolated in a temporary folder: it does not see this project's modules
    assert code_checks("import paradec\n", "pass")["passes_tests"] is False
