"""`autofl train` uses the threads it is given (issue 42: torch's default took every core, and on
a shared machine a round took 27 s against 1.9 s at one thread)."""

from __future__ import annotations

import pytest
import torch

import autofl
from autofl import device

TINY = {"fl": {"rounds": 2}, "data": {"num_clients": 3}, "runtime": {"device": "cpu"}}


@pytest.fixture
def torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def threads_while_training(tmp_path, config) -> set[int]:
    seen: set[int] = set()
    autofl.train(config, out=tmp_path / "run", on_round=lambda metrics, seconds: seen.add(torch.get_num_threads()))
    return seen


def test_train_runs_on_the_configured_threads(tmp_path, torch_threads):
    torch.set_num_threads(2)
    assert threads_while_training(tmp_path, {**TINY, "runtime": {"device": "cpu", "threads": 1}}) == {1}


def test_train_without_a_setting_runs_on_the_cpus_the_process_is_given(tmp_path, torch_threads, monkeypatch):
    torch.set_num_threads(2)
    monkeypatch.setattr(device, "available_cpus", lambda: 1)  # e.g. taskset -c 0, or a cgroup quota of one CPU
    assert threads_while_training(tmp_path, TINY) == {1}


def test_available_cpus_follows_the_affinity_mask():
    import os

    assert 1 <= device.available_cpus() <= len(os.sched_getaffinity(0))
