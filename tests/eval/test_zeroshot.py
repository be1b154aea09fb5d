import pytest

from lowbit.data.zeroshot import UnknownTaskError, ZeroShotItem, load_task, parse_item
from lowbit.eval.loglik import encode_pair, score_reference
from lowbit.eval.zeroshot import choice_metrics, evaluate_items, evaluate_tasks


def test_acc_and_acc_norm_follow_the_harness_definitions():
    # Choice 0 has the higher total log-likelihood, choice 1 the higher per-character one.
    assert choice_metrics([-10.0, -12.0], ("ab", "abcdefgh"), gold=0) == (1.0, 0.0)
    assert choice_metrics([-10.0, -12.0], ("ab", "abcdefgh"), gold=1) == (0.0, 1.0)
    # ties go to the first choice, as numpy.argmax does in the harness
    assert choice_metrics([-3.0, -3.0], ("x", "y"), gold=0) == (1.0, 1.0)
    with pytest.raises(ValueError):
        choice_metrics([-1.0], ("",), 0)


def test_pipeline_metrics_equal_metrics_of_reference_scores(tiny, tokenizer):
    items = load_task("arc_easy", limit=6) + load_task("piqa", limit=4)
    res = evaluate_items(tiny, tokenizer, "arc_easy", items, batch_size=5, progress=False)
    accs, norms = [], []
    for it in items:
        lls = [score_reference(tiny, encode_pair(tokenizer, c, x)).logprob for c, x in it.pairs]
        a, n = choice_metrics(lls, it.choice_texts, it.gold)
        accs.append(a)
        norms.append(n)
    assert res.n_items == 10
    assert res.acc == pytest.approx(sum(accs) / 10)
    assert res.acc_norm == pytest.approx(sum(norms) / 10)


def test_lambada_greedy_known_answer(tiny, tokenizer):
    import torch

    ctx = "The old man walked slowly to the"
    ids = tokenizer(ctx, add_special_tokens=False).input_ids
    with torch.inference_mode():
        nxt = int(tiny(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
    word = tokenizer.decode([nxt])
    if not word.startswith(" ") or len(word.strip()) == 0 or encode_pair(tokenizer, ctx, word).continuation != [nxt]:
        pytest.skip("the tiny model's argmax token does not round-trip as a word")
    right = parse_item("lambada_openai", {"context": ctx, "continuation": word.strip()})
    wrong = parse_item("lambada_openai", {"context": ctx, "continuation": "zebra" if word.strip() != "zebra" else "apple"})
    res = evaluate_items(tiny, tokenizer, "lambada_openai", [right, wrong], progress=False)
    assert res.acc == 0.5 and res.acc_norm is None and res.ppl is not None


def test_winogrande_has_no_acc_norm(tiny, tokenizer):
    res = evaluate_items(tiny, tokenizer, "winogrande", load_task("winogrande", limit=4), progress=False)
    assert res.acc_norm is None and 0 <= res.acc <= 1 and res.n_items == 4


def test_unknown_task_fails_before_any_work(tiny, tokenizer):
    with pytest.raises(UnknownTaskError, match="known tasks"):
        evaluate_tasks(tiny, tokenizer, ["piqa", "hellaswag"], limit=1)


@pytest.mark.model
def test_real_model_gets_hand_made_items_right():
    """Easy items a 135M model gets right by a clear margin (log-likelihood gaps of 2 to 12 nats)."""
    from lowbit.checkpoint import load_model

    model, tok = load_model("default")
    items = [
        parse_item("arc_easy", {"query": "Question: What color is the sky on a clear sunny day?", "choices": ["purple", "blue", "green"], "gold": 1}),
        parse_item("arc_easy", {"query": "Question: How many legs does a dog have?", "choices": ["four", "eleven"], "gold": 0}),
        parse_item("arc_easy", {"query": "Question: What is the capital city of France?", "choices": ["Paris", "Banana"], "gold": 0}),
    ]
    res = evaluate_items(model, tok, "arc_easy", items, progress=False)
    assert res.acc == 1.0
    lam = [ZeroShotItem(pairs=(("One, two, three, four, five, six, seven, eight, nine,", " ten"),), gold=0, kind="greedy", choice_texts=("ten",))]
    assert evaluate_items(model, tok, "lambada_openai", lam, progress=False).acc == 1.0


def test_a_users_jsonl_set_is_scored_like_arc(tiny, tokenizer, tmp_path):
    """`--tasks path/to/set.jsonl`: the shipped sets' shape, formatted and scored as PIQA/ARC are."""
    import json

    from lowbit.data.paths import data_file
    from lowbit.eval.zeroshot import evaluate_task

    items = load_task("arc_easy", limit=5)
    with open(data_file("zeroshot/arc_easy.jsonl"), encoding="utf-8") as f:
        raw = [json.loads(next(f)) for _ in range(5)]
    own = tmp_path / "my_set.jsonl"
    own.write_text("".join(json.dumps(o) + "\n" for o in raw) + "\n")
    assert load_task(str(own)) == items
    mine = evaluate_task(tiny, tokenizer, str(own), batch_size=4, progress=False)
    ref = evaluate_items(tiny, tokenizer, "arc_easy", items, batch_size=4, progress=False)
    assert (mine.acc, mine.acc_norm, mine.n_items) == (ref.acc, ref.acc_norm, 5)


@pytest.mark.parametrize("line,message", [
    ('{"query": "Q", "choices": ["a", "b"]}', r"set.jsonl:2: missing field\(s\) \['gold'\]"),
    ('{"query": "Q", "choices": ["a", "b"], "gold": 2}', r"set.jsonl:2: gold index 2 out of range"),
    ('{"query": "Q", "choices": ["a", "b"], "gold": "1"}', r"set.jsonl:2: 'gold' must be an integer"),
    ('{"query": "Q", "choices": "ab", "gold": 0}', r"set.jsonl:2: 'query' must be a string and 'choices' a list"),
    ('[1, 2]', r"set.jsonl:2: expected a JSON object"),
    ('{"query": "Q", ', r"set.jsonl:2: not valid JSON"),
])
def test_a_malformed_line_of_a_users_set_is_named(tmp_path, line, message):
    own = tmp_path / "set.jsonl"
    own.write_text('{"query": "Question: ok?", "choices": ["yes", "no"], "gold": 0}\n' + line + "\n")
    with pytest.raises(ValueError, match=message):
        load_task(str(own))


def test_a_missing_users_set_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="zero-shot set not found"):
        load_task(str(tmp_path / "nope.jsonl"))
