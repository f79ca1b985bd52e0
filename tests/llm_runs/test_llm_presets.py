"""The presets' descriptions state their configuration's numbers (:func:`llm_runs.runs.presets.describe`): every
number a description states is a field of its template, taken from the configuration, for every preset and its
``quick`` and ``shrunk`` variants, so a description cannot drift from the numbers it states. Data only: no model."""

from __future__ import annotations

import re
import string
from dataclasses import replace

import pytest

from llm_runs.runs.presets import PRESETS, describe

#: Names in the descriptions' literal text that hold a digit and are not a number of the configuration.
NAMES = ("Phase 1", "Phase 2", "Pipeline 1", "Pipeline 2", "Algorithm 1", "bf16", "on 2 CPU cores")

VARIANTS = {f"{k}{v}": (p if not v else getattr(p, v[1:])()) for k, p in PRESETS.items()
            for v in ("", ".quick", ".shrunk")}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_number_a_description_states_is_a_field_of_the_configuration(name):
    p = VARIANTS[name]
    literal = "".join(text for text, _, _, _ in string.Formatter().parse(p.template))
    for n in NAMES:
        literal = literal.replace(n, "")
    assert not re.search(r"\d", literal), (name, re.findall(r"[^,;(]*\d[^,;)]*", literal))
    fields = [f for _, f, _, _ in string.Formatter().parse(p.template) if f]
    assert fields and p.description == describe(p.template, p) and "{" not in p.description
    assert "template" not in p.to_dict() and p.to_dict()["description"] == p.description


def test_a_variant_states_its_own_numbers():
    shrunk = PRESETS["smoke"].shrunk()
    assert "2 training clients around 2 preference centres and 1 new client," in shrunk.description
    assert "4 training clients" not in shrunk.description and "1 adaptation step" in shrunk.description
    study = PRESETS["study"]
    other = replace(study, design=replace(study.design, n_train=7, heldout_pairs=33))
    assert "7 training clients" in other.description and "33 held-out pairs per objective" in other.description
    shots = PRESETS["shots"]
    assert "per budget 1, 2, 4, 8, 16 pairs per objective" in shots.description
    assert "per budget 1, 2 pairs per objective" in shots.shrunk().description
    cut = replace(shots, shots=replace(shots.shots, oracle_steps=5))
    assert "5 AdamW steps" in cut.description and cut.template == shots.template
