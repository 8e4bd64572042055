"""sampler.skip_repeats (autofl/tuning/strategy/repeats.py): a proposal a finished trial already trained is
told that trial's outcome and the sampler asked again; the repeats count against no budget."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from autofl.tuning.store.ledger import counted
from autofl.tuning.strategy.repeats import ask_unseen, is_repeat
from autofl.tuning.strategy.space import SearchSpace
from conftest import new_ledger


def define(trial):
    trial.suggest_categorical("a", [1, 2])
    trial.suggest_categorical("b", ["x", "y"])


def test_trained_configs_are_told_not_retrained_until_the_grid_is_exhausted():
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    trained = []
    for n in range(4):
        trial, _ = ask_unseen(study, define)
        trained.append(tuple(trial.params.values()))
        if n == 1:  # one config stopped early: its repeats are PRUNED with its rounds
            trial.report(0.1, 1)
            study.tell(trial, state=TrialState.PRUNED)
        else:
            trial.report(0.5 + n / 10, 1)
            trial.report(0.6 + n / 10, 2)
            study.tell(trial, 0.6 + n / 10)
    assert len(set(trained)) == 4  # every config of the 2 x 2 grid once, whatever the sampler drew
    repeats = [t for t in study.trials if is_repeat(t)]
    assert repeats, "seed 0 draws some repeats among its first four configs' proposals"
    for r in repeats:
        twin = study.trials[r.user_attrs["repeat_of"]]
        assert (r.params, r.state, r.value, r.intermediate_values) == (
            twin.params, twin.state, twin.value, twin.intermediate_values)
    # the grid is exhausted: after `tries` told repeats the proposal is trained again
    before = len(study.trials)
    trial, _ = ask_unseen(study, define, tries=3)
    assert len(study.trials) == before + 4 and not is_repeat(study.trials[-1])
    assert sum(is_repeat(t) for t in study.trials[before:]) == 3 and trial.number == before + 3



def test_the_ledger_asks_past_repeats_and_they_count_against_no_budget(tmp_path):
    ledger = new_ledger(tmp_path)
    sampler = optuna.samplers.RandomSampler(seed=1)
    known: set[str] = set()
    for i in range(4):
        number, params = ledger.ask("run-1", f"t{i}", known, budget=4, sampler=sampler, define=define,
                                    skip_repeats=True)
        known.add(f"t{i}")
        assert ledger.close(number, {"round": 2, "acc": 0.5}, False, ["acc"], max_t=2) == "COMPLETE"
    trials = ledger.trials()
    tagged = [t for t in trials if "tune_trial_id" in t.user_attrs]
    assert len(tagged) == 4 and len({tuple(t.params.values()) for t in tagged}) == 4
    assert all(counted(t) != is_repeat(t) for t in trials)  # a told repeat is never counted
    # nor do its copied rounds spend the study's budget_rounds
    assert any(is_repeat(t) and t.intermediate_values for t in trials)
    assert ledger.rounds_used() == {str(t.user_attrs["tune_trial_id"]): 2 for t in tagged}
    assert ledger.ask("run-1", "t4", known, budget=4, sampler=sampler, define=define, skip_repeats=True) is None


@pytest.mark.parametrize("kind", ["tpe", "random", "grid", "qmc"])
def test_skip_repeats_is_an_option_of_every_sampler_kind(kind):
    space = SearchSpace.model_validate({"study": "s", "params": {"fl.lr": {"type": "categorical", "choices": [0.1, 0.01]}},
                                        "sampler": {"kind": kind, "skip_repeats": True}, "trials": 2})
    assert space.sampler.skip_repeats and "skip_repeats" not in space.sampler.options()


def test_once_a_finite_space_is_exhausted_proposals_are_trained_without_told_repeats():
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(4):
        trial, _ = ask_unseen(study, define, space_size=4)
        study.tell(trial, 0.5)
    before = len(study.trials)
    ask_unseen(study, define, space_size=4)
    assert len(study.trials) == before + 1 and not is_repeat(study.trials[-1])


def test_the_study_searcher_takes_the_option_from_the_space(tmp_path):
    """The space's sampler.skip_repeats reaches the ledger through the searcher Tune drives."""
    from autofl.tuning.tune.experiment import make_searcher

    space = SearchSpace.model_validate({
        "study": "s", "trials": 4, "start_from_base": False,
        "params": {"fl.lr": {"type": "categorical", "choices": [0.1, 0.01]},
                   "fl.momentum": {"type": "categorical", "choices": [0.0, 0.9]}},
        "sampler": {"kind": "random", "skip_repeats": True}, "scheduler": {"kind": "none"}})
    ledger = new_ledger(tmp_path)
    searcher = make_searcher(space, ledger, "run-1", trials=4, with_start_point=False)
    configs = []
    for i in range(4):
        params = searcher.suggest(f"t{i}")
        configs.append((params["fl.lr"], params["fl.momentum"]))
        searcher.on_trial_complete(f"t{i}", {"round": space.max_rounds, space.objective: 0.5})
    assert len(set(configs)) == 4
