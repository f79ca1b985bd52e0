"""Tests of sim.algorithm.configs: the checks of Algorithm 1's configurations and their defaults."""

from __future__ import annotations

import json

import numpy as np
import pytest

import sim.algorithm as al


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: al.Phase1Config(eta_local=0.0), "eta_local"),
        (lambda: al.Phase1Config(alpha_server=-1.0), "alpha_server"),
        (lambda: al.Phase1Config(tau=0), "tau"),
        (lambda: al.Phase1Config(eps_mode=-1e-3), "eps_mode"),
        (lambda: al.Phase2Config(eta_meta_inner=0.0), "eta_meta_inner"),
        (lambda: al.Phase2Config(alpha_server=float("nan")), "alpha_server"),
        (lambda: al.Phase2Config(K=0), "K"),
        (lambda: al.Phase2Config(S=0), "S"),
        (lambda: al.AdaptConfig(alpha_adapt=-0.1), "alpha_adapt"),
        (lambda: al.AdaptConfig(p_minus=2.0, p_plus=1.0), "p_minus"),
        (lambda: al.AdaptConfig(preconditioner="fixed"), r"preconditioner='fixed' needs an SPD matrix P; got P=None"),
        (lambda: al.AdaptConfig(preconditioner="fixed", P=-np.eye(2)), "positive definite"),
        (lambda: al.AdaptConfig(beta2=1.0), "beta2"),
        (lambda: al.Pipeline2Config(eta=0.0), "eta"),
        (lambda: al.ClusterConfig(threshold=None, k=None), "threshold"),
        (lambda: al.ClusterConfig(method="kmeans", threshold=None),
         r"method='kmeans' needs k and no threshold; got threshold=None, k=None"),
        (lambda: al.ClusterConfig(method="kmeans", k=3),
         r"method='kmeans' needs k and no threshold; got threshold=0\.25, k=3"),
        (lambda: al.Pipeline2Config(decay_steps=0.0), r"Pipeline2Config\.decay_steps must be a finite number > 0; got 0\.0"),
        (lambda: al.Pipeline2Config(decay_steps=-5), r"decay_steps must be a finite number > 0; got -5"),
        (lambda: al.Phase1Config(rounds=-1), r"^Phase1Config\.rounds must be an integer >= 0; got -1$"),
        (lambda: al.Phase1Config(descent="loose"), r"^Phase1Config\.descent must be one of \('restricted', "),
        (lambda: al.Phase2Config(B=-1.0), r"^Phase2Config\.B must be a finite number > 0; got -1\.0$"),
        (lambda: al.AdaptConfig(preconditioner="adam"), r"^AdaptConfig\.preconditioner must be one of \('identity', "),
        (lambda: al.AdaptConfig(weight_decay=-1.0), r"^AdaptConfig\.weight_decay must be a finite number >= 0; got -1\.0$"),
        (lambda: al.Pipeline2Config(record_every=0), r"^Pipeline2Config\.record_every must be an integer >= 1; got 0$"),
    ],
)
def test_bad_configuration_raises(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_documented_configurations_are_accepted():
    """The settings the docstrings name: k-means with k and no threshold, a constant Pipeline-2 step, no rounds;
    and the defaults a user gets."""
    assert al.Phase1Config(rounds=0).rounds == 0 and al.Phase2Config(B=2.5).B == 2.5
    assert (al.Phase1Config().rounds, al.Phase1Config().tau, al.Phase1Config().eta_local) == (100, 1, 0.1)
    p2 = al.Phase2Config()
    assert (p2.rounds, p2.S, p2.K, p2.eta_meta_inner, p2.alpha_server) == (50, 8, 5, 0.05, 1.0)
    ad = al.AdaptConfig()
    assert (ad.K, ad.S, ad.alpha_adapt, ad.preconditioner, ad.p_minus, ad.p_plus) == (20, 8, 0.1, "identity", 0.5, 2.0)
    assert al.ClusterConfig(method="kmeans", k=3, threshold=None).k == 3
    assert al.Pipeline2Config(decay_steps=None).decay_steps is None
    assert al.Pipeline2Config(decay_steps=50).decay_steps == 50


@pytest.mark.parametrize("make, field", [
    (lambda: al.ClusterConfig(), "method"), (lambda: al.Phase1Config(), "rounds"), (lambda: al.Phase2Config(), "K"),
    (lambda: al.AdaptConfig(), "K"), (lambda: al.Pipeline2Config(), "eta"), (lambda: al.AlgorithmConfig(), "phase1"),
])
def test_every_configuration_is_frozen(make, field):
    """A configuration is a value: a run's recorded parameters cannot drift from the object that made them."""
    import dataclasses

    cfg = make()
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(cfg, field, getattr(cfg, field))


def test_the_cluster_count_check_names_k():
    with pytest.raises(ValueError, match=r"ClusterConfig\.k must be an integer >= 1; got 0"):
        al.ClusterConfig(method="kmeans", k=0, threshold=None)


def test_the_symmetry_tolerance_of_a_fixed_preconditioner_is_inclusive():
    """``P`` counts as symmetric up to ``|P - Pᵀ| ≤ 1e-12·max(1, |P|)``, the bound itself included; one ulp above it
    is refused."""
    at = np.array([[1.0, 1e-12], [0.0, 1.0]])
    assert al.AdaptConfig(preconditioner="fixed", P=at).P[0, 1] == 1e-12
    above = at.copy()
    above[0, 1] = np.nextafter(1e-12, 1.0)
    with pytest.raises(ValueError, match=r"\.P must be symmetric"):
        al.AdaptConfig(preconditioner="fixed", P=above)


def test_to_dict_keeps_the_arrays_as_lists():
    """``AlgorithmConfig.to_dict`` (the records' and the JSON's parameters) keeps a fixed preconditioner's ``P`` of
    the nested configurations, as a plain list that JSON writes and reads back."""
    P = np.array([[2.0, 0.5], [0.5, 1.0]])
    cfg = al.AlgorithmConfig(adapt=al.AdaptConfig(preconditioner="fixed", P=P),
                             adamw=al.AdaptConfig(preconditioner="fixed", P=2 * P))
    d = json.loads(json.dumps(cfg.to_dict()))
    assert d["adapt"]["P"] == P.tolist() and d["adamw"]["P"] == (2 * P).tolist()
    assert d["adapt"]["preconditioner"] == "fixed" and d["pipeline2"]["record_every"] == 50
