"""No test split is read before a study ends (issue 40 item 6).

A search's trials build their data with every test split empty (`FederatedData.without_test`): the
clients' test indices, the newcomers' (held-out clients') test indices and the global test set. So
their rounds report no test metric, compute no harmed-client references (those are read off the test
splits), and the search never holds a test index to read. Re-evaluation (`autofl reeval`,
`best-config export --reeval`), `autofl train` and the report's re-evaluation tables read them.

The proof poisons every test sample with NaN: a sealed trial's every round (its training, its
validation metrics) equals the same config's run on the clean data, and no round carries a test
metric; the same poisoned data unsealed, as re-evaluation trains it, does show the poison.
"""

from __future__ import annotations

import math

import pytest
import torch

from autofl.data.datasets import RawDataset, load_raw_dataset
from autofl.data.federated import build_federated
from autofl.engine.simulation import Simulation
from autofl.experiment import build_experiment, load_experiment
from autofl.methods.registry import get_method_class
from autofl.tuning.strategy.objectives import TEST_METRICS
from autofl.tuning.strategy.space import experiment_dict
from autofl.tuning.tune.trainable import FLTrainable

# pool train+test: the official test set is pooled and the clients' test splits are cut from it too;
# two held-out clients and the harmed-client fractions: every metric that reads a test split is asked for
BASE = {"data": {"num_clients": 6, "pool": "train+test", "holdout_clients": 2}, "fl": {"rounds": 3},
        "method": {"name": "ditto"}, "eval": {"harmed_clients": True},
        "runtime": {"compile": "off", "dtype": "float64", "device": "cpu"}}
CONFIG = {"fl.lr": 0.1}


def poisoned(raw: RawDataset) -> RawDataset:
    """`raw` with NaN in every sample that is a test sample of BASE's partition: the clients' and the
    held-out clients' test splits (cut from the pooled train+test set) and the global test set."""
    exp = build_experiment(experiment_dict(BASE, CONFIG, {}))
    data = build_federated(raw, exp.data, exp.data_seed())
    test = torch.cat([c.test for c in [*data.clients, *data.newcomers]])
    pool = torch.cat([raw.train_x, raw.test_x]).clone()
    pool[test] = math.nan
    n = len(raw.train_x)
    return RawDataset(raw.name, pool[:n], raw.train_y, pool[n:], raw.test_y, raw.num_classes)


def trial(raw: RawDataset, seal: bool, reference_dir: str) -> FLTrainable:
    t = FLTrainable.__new__(FLTrainable)  # what tune.with_parameters hands to setup, minus the cluster
    t.setup(CONFIG, base=BASE, raw_data=raw, threads=1, seal_test=seal, reference_dir=reference_dir)
    return t


@pytest.fixture(scope="module")
def clean() -> RawDataset:
    return load_raw_dataset(load_experiment(None, []).data)


def test_a_search_trial_reads_no_test_sample(clean, tmp_path):
    bad = poisoned(clean)
    assert torch.isnan(bad.train_x).any() and torch.isnan(bad.test_x).any()
    sealed = trial(bad, seal=True, reference_dir=str(tmp_path / "refs"))
    data = sealed.sim.data
    assert all(len(c.test) == 0 for c in [*data.clients, *data.newcomers]) and len(data.test_y) == 0
    rounds = [sealed.step() for _ in range(3)]
    assert [r["round"] for r in rounds] == [1, 2, 3] and rounds[-1]["done"]
    for r in rounds:
        assert not set(TEST_METRICS) & set(r), f"round {r['round']} reports a test metric"
    assert not (tmp_path / "refs").exists()  # no harmed-client reference was trained

    exp = build_experiment(experiment_dict(BASE, CONFIG, {}))
    alone = list(Simulation(exp, get_method_class("ditto"), raw=clean).run())
    for r, a in zip(rounds, alone):  # the poison reached nothing: training and validation as on clean data
        assert {k: r[k] for k in a if k not in TEST_METRICS} == {k: a[k] for k in a if k not in TEST_METRICS}
        assert math.isfinite(r["train_loss"]) and "unseen_val_acc" in r


def test_re_evaluation_reads_the_test_splits(clean, tmp_path):
    """The control: unsealed (as `autofl reeval` trains a config), the same poisoned data is read, so the
    sealed trial's equality above is not for want of test samples."""
    bad, refs = poisoned(clean), str(tmp_path / "refs")
    last_bad = [trial(bad, seal=False, reference_dir=refs).step() for _ in range(1)][-1]
    last_clean = trial(clean, seal=False, reference_dir=str(tmp_path / "clean-refs")).step()
    assert {"personal_test_acc", "global_test_acc", "unseen_test_acc", "harmed_frac"} <= set(last_bad)
    assert last_bad["personal_test_acc"] != last_clean["personal_test_acc"]
    assert last_bad["personal_val_acc"] == last_clean["personal_val_acc"]


def test_a_space_whose_target_metric_reads_the_test_split_is_refused():
    """`rounds_to_target` watching a test metric would be silently absent from every trial: one line instead."""
    from autofl.errors import ConfigError
    from autofl.tuning.strategy.space import parse_space, parse_stored_space

    space = {"study": "s", "trials": 2, "params": {"fl.lr": {"type": "float", "low": 0.01, "high": 0.1}},
             "base": {"fl": {"rounds": 2}, "eval": {"target_acc": 0.5, "target_metric": "global_test_acc"}}}
    with pytest.raises(ConfigError, match=r"^s.yaml: base.eval.target_metric: 'global_test_acc' reads the test split, "
                       r"which a search never reads; allowed: personal_val_acc, personal_val_acc_p10, global_val_acc"):
        parse_space(space, "s.yaml")
    assert parse_stored_space(space, "s.yaml").base["eval"]["target_metric"] == "global_test_acc"  # an older study: readable
    space["base"]["eval"]["target_metric"] = "global_val_acc"
    assert parse_space(space, "s.yaml").base["eval"]["target_metric"] == "global_val_acc"
    space["params"]["eval.target_metric"] = {"type": "categorical", "choices": ["global_val_acc", "personal_test_acc"]}
    with pytest.raises(ConfigError, match=r"params.eval.target_metric: 'personal_test_acc' reads the test split"):
        parse_space(space, "s.yaml")
