"""Separable pairs a client owns (llm_runs.preferences.heldout): no comparison in two objectives' lists, nested budgets, the
λ-weighted accuracy, and the existing presets' federations unchanged. Data only: no model, no torch."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from llm_runs.preferences.clients import DataShortageError, build_federation, calibration_split
from llm_runs.preferences.data import DEFAULT_DATA_FILE, PreferencePair, load_candidates, within_prompt_scale
from llm_runs.preferences.heldout import (
    ShotsDesign,
    build_shots_federation,
    comparison,
    lambda_weighted_accuracy,
    scalarised_pairs,
    separable_capacity,
    separable_pairs,
    shared_comparisons,
)
from llm_runs.runs.presets import OBJECTIVES_3, PRESETS

SHOTS = ShotsDesign.for_objectives(OBJECTIVES_3)


@pytest.fixture(scope="module")
def cands():
    if not DEFAULT_DATA_FILE.exists():
        pytest.skip("the shipped data file is not built")
    return load_candidates()


@pytest.fixture(scope="module")
def study(cands):
    return calibration_split(cands.prompt_ids)[1]


def _pair(objective: str, prompt: str, chosen: int, rejected: int) -> PreferencePair:
    return PreferencePair(objective, prompt, prompt, f"r{chosen}", f"r{rejected}", 1.0, chosen, rejected)


def _separable(pairs_by_objective) -> bool:
    return not shared_comparisons(pairs_by_objective)


def test_the_existing_builder_shares_comparisons_between_objectives_and_the_separable_one_does_not(cands, study):
    """The study preset's federation holds the same comparison (either order) in two objectives' held-out lists and
    in most new clients' lists; the shots federation, on the same prompts, in none (held-out or any client)."""
    old = build_federation(cands, PRESETS["study"].design, np.random.default_rng(0), prompt_ids=study)
    assert len(shared_comparisons(old.heldout)) > 50
    assert sum(not _separable(old.data[i]) for i in old.new) >= 5
    for seed in range(3):
        fed = build_shots_federation(cands, SHOTS, np.random.default_rng(seed), prompt_ids=study)
        assert _separable(fed.heldout) and all(_separable(d) for d in fed.data)
        assert [len(h) for h in fed.heldout] == [SHOTS.clients.heldout_pairs] * 3
        assert fed.n_samples.tolist() == [8] * 6 + [16] * 9
        for i in range(fed.n_clients):
            for j, pairs in enumerate(fed.data[i]):  # each pair labelled by its own objective, on the client's prompts
                assert all(p.objective == OBJECTIVES_3[j] and p.prompt_id in fed.prompt_ids[i] for p in pairs)
        shares = [set(p) for p in fed.prompt_ids] + [set(fed.heldout_prompt_ids)]
        assert sum(map(len, shares)) == len(set().union(*shares)) and set().union(*shares) <= set(study)
        assert len(fed.heldout_prompt_ids) >= 25


def test_a_comparison_and_its_reverse_are_one_comparison():
    a, b = _pair("x", "p", 0, 2), _pair("y", "p", 2, 0)
    assert comparison(a) == comparison(b) == ("p", 0, 2)
    assert shared_comparisons([[a], [b]]) == {("p", 0, 2)}
    assert shared_comparisons([[a, a], [_pair("y", "p", 1, 2)]]) == set()


def test_the_draw_meets_every_count_the_comparisons_can_meet():
    """'x' is eligible only for comparisons 0 and 1, 'y' for all four: 2 pairs each are reachable only by giving 'y'
    comparisons 2 and 3. A draw ignoring the other objective's needs takes 0 or 1 for 'y' half the time."""
    x = [_pair("x", "p", 0, k) for k in (1, 2)]
    y = [_pair("y", "p", 0, k) for k in (1, 2, 3)] + [_pair("y", "p", 1, 2)]
    assert separable_capacity([x, y]) == 2
    for seed in range(20):
        got = separable_pairs([x, y], 2, np.random.default_rng(seed), objectives=("x", "y"))
        assert sorted(map(comparison, got[0])) == [("p", 0, 1), ("p", 0, 2)]
        assert sorted(map(comparison, got[1])) == [("p", 0, 3), ("p", 1, 2)]


def test_a_shortage_names_the_objectives_and_the_counts():
    x = [_pair("x", "p", 0, k) for k in (1, 2)]
    y = [_pair("y", "p", 0, k) for k in (1, 2, 3)]
    with pytest.raises(DataShortageError, match=r"client 3: objective 'x' needs 3 separable pairs and its eligible "
                                                r"comparisons number 2"):
        separable_pairs([x, y], [3, 1], np.random.default_rng(0), objectives=("x", "y"), where="client 3")
    with pytest.raises(DataShortageError, match=r"objectives 'x' and 'y' need 2 \+ 2 separable pairs and their "
                                                r"eligible comparisons number 3"):
        separable_pairs([x, y], 2, np.random.default_rng(0), objectives=("x", "y"))
    with pytest.raises(ValueError, match="pair counts must be integers >= 0"):
        separable_pairs([x, y], 1.5, np.random.default_rng(0))


def test_the_study_side_cannot_hold_nine_new_clients_of_64_pairs(cands, study):
    with pytest.raises(DataShortageError, match=r"run out at new client \d+: objectives? '\w+'.* need.* 64 separable"):
        build_shots_federation(cands, ShotsDesign.for_objectives(OBJECTIVES_3, (1, 2, 4, 8, 16, 64)),
                               np.random.default_rng(0), prompt_ids=study)


def test_a_new_clients_budgets_are_nested_and_each_separable(cands, study):
    fed = build_shots_federation(cands, SHOTS, np.random.default_rng(1), prompt_ids=study)
    for i in fed.new:
        last: dict[str, list] = {o: [] for o in OBJECTIVES_3}
        for b in SHOTS.budgets:
            batch = fed.batch(i, SHOTS.budget_samples(b))
            assert [len(v) for v in batch.values()] == [b] * 3 and _separable(batch.values())
            assert all(batch[o][: len(last[o])] == last[o] for o in OBJECTIVES_3)
            last = batch
    with pytest.raises(ValueError, match="budget 3 is not one of the design's budgets"):
        SHOTS.budget_samples(3)
    for bad in ((), (2, 1), (1, 1), (0, 4), (1.5,)):
        with pytest.raises(ValueError, match="budgets must be increasing integers"):
            ShotsDesign.for_objectives(OBJECTIVES_3, bad)


def test_the_shots_federation_is_a_function_of_the_generator(cands, study):
    def key(fed):
        return [fed.prefs.tolist(), fed.prompt_ids, fed.heldout_prompt_ids, fed.heldout, fed.data]

    a = build_shots_federation(cands, SHOTS, np.random.default_rng(5), prompt_ids=study)
    assert key(a) == key(build_shots_federation(cands, SHOTS, np.random.default_rng(5), prompt_ids=study))
    assert key(a) != key(build_shots_federation(cands, SHOTS, np.random.default_rng(6), prompt_ids=study))


def test_the_lambda_weighted_accuracy_of_a_hand_example():
    objectives = ("a", "b", "c")
    acc = {"a": 1.0, "b": 0.5, "c": 0.0}
    assert lambda_weighted_accuracy([0.5, 0.3, 0.2], acc, objectives) == pytest.approx(0.5 + 0.15)
    evaluated = {o: {"loss": 0.6, "accuracy": v, "pairs": 4} for o, v in acc.items()}  # PreferenceModel.evaluate
    assert lambda_weighted_accuracy([0.2, 0.3, 0.5], evaluated, objectives) == pytest.approx(0.2 + 0.15)
    with pytest.raises(ValueError, match="no held-out accuracy of objective 'c'"):
        lambda_weighted_accuracy([0.5, 0.3, 0.2], {"a": 1.0, "b": 1.0}, objectives)
    with pytest.raises(ValueError, match="2 entries for 3 objectives"):
        lambda_weighted_accuracy([0.5, 0.5], acc, objectives)
    with pytest.raises(ValueError, match="open simplex"):
        lambda_weighted_accuracy([1.0, 0.0, 0.0], acc, objectives)
    with pytest.raises(ValueError, match="accuracy of objective 'b' is 1.5"):
        lambda_weighted_accuracy([0.5, 0.3, 0.2], {**acc, "b": 1.5}, objectives)


def test_scalarised_pairs_follow_the_clients_standardised_reward(cands, study):
    lam = np.array([0.6, 0.3, 0.1])
    scales = [within_prompt_scale(cands.scores_of(o)) for o in OBJECTIVES_3]
    reward = sum(w * cands.scores_of(o) / s for w, o, s in zip(lam, OBJECTIVES_3, scales, strict=True))
    row = {pid: k for k, pid in enumerate(cands.prompt_ids)}
    pairs = scalarised_pairs(cands, OBJECTIVES_3, lam, prompt_ids=study[:40])
    assert pairs and {p.prompt_id for p in pairs} <= set(study[:40])
    gap_floor = 0.25 * within_prompt_scale(reward)
    for p in pairs:
        r = reward[row[p.prompt_id]]
        assert p.objective == "scalarised" and r[p.chosen_index] - r[p.rejected_index] >= gap_floor
    with pytest.raises(ValueError, match="3 entries for 2 objectives"):
        scalarised_pairs(cands, OBJECTIVES_3[:2], lam)


def _digest(fed) -> str:
    def pairs(ps):
        return [[p.prompt_id, p.chosen_index, p.rejected_index, p.objective] for p in ps]

    doc = {"prefs": [[f"{x:.12g}" for x in row] for row in fed.prefs], "prompts": fed.prompt_ids,
           "heldout_prompts": fed.heldout_prompt_ids, "heldout": [pairs(h) for h in fed.heldout],
           "data": [[pairs(d) for d in client] for client in fed.data]}
    return hashlib.sha256(json.dumps(doc).encode()).hexdigest()


#: The seed-0 federations of the presets as their runs deal them (trained text at the preset's token limit), from
#: the builder before the separable pairs were added: their prompts, pairs and preferences must not move.
PRESET_DIGESTS = {
    "smoke": "a9c4568d9f6a0a01090a7cbb892c06107c0f3c6270d126f9d7d6d2fe709f5499",
    "cpu": "1626d07e9d9ec833a287b42a9ace9855ffcfb169890249eb52f058a21a999a23",
    "study": "26f304aa6cdfe1af7889db710572b44ca685c06327a23037c8b33830e1209f48",
}


@pytest.mark.parametrize("name", sorted(PRESET_DIGESTS))
def test_the_existing_presets_federations_are_unchanged(cands, name):
    pytest.importorskip("transformers")
    from llm_runs.model.tokenizer import smollm2_tokenizer
    from llm_runs.preferences.data import trained_candidates

    preset = PRESETS[name]
    trained = trained_candidates(cands, smollm2_tokenizer(), preset.max_response_tokens, preset.design.objectives)
    assert _digest(build_federation(trained, preset.design, np.random.default_rng(0))) == PRESET_DIGESTS[name]
