"""resources.gpu: auto: the packing arithmetic and the out-of-memory line on fixed numbers, and its
CPU-only resolution (0, said in one line)."""

from __future__ import annotations

import os

import pytest
import torch
import yaml

from autofl.tuning.tune import gpu_packing as gp
from autofl.tuning.strategy.space import load_space

GIB = 1024**3


def test_trials_per_card_keeps_the_margin_free():
    card = 80 * GIB
    assert gp.trials_per_card(10 * GIB, card, margin=0.2) == 6  # 64 GiB usable / 10
    assert gp.trials_per_card(8 * GIB, card, margin=0.2) == 8  # exactly 64
    assert gp.trials_per_card(int(8 * GIB) + 1, card, margin=0.2) == 7
    assert gp.trials_per_card(1 * GIB, card, margin=0.0) == 80
    assert gp.trials_per_card(100 * GIB, card) == 1  # never below one trial a card
    with pytest.raises(ValueError):
        gp.trials_per_card(0, card)


@pytest.mark.parametrize("n", [1, 2, 3, 6, 7, 64, 1000])
def test_fractions_of_n_trials_fit_one_card(n):
    share = gp.gpu_fraction(n)
    assert 0 < share <= 1 / n and n * share <= 1.0
    assert int(1 / share) == n or 1 / share < n + 1  # and not so small that an extra trial fits


def test_packing_line_says_how_many_trials_share_a_card():
    line = gp.packing_line(10 * GIB, 80 * GIB, 0.2)
    assert line == ("resources.gpu: auto = 0.1666: a trial peaks at 10.00 GiB of GPU memory in a dry round, "
                    "so 6 trials share each 80.0 GiB card (20% kept free)")


def test_no_more_trials_share_a_card_than_the_cpus_run_at_once():
    """On an H200 (2026-11-26) a digits trial's dry round peaked at about 0.06 GiB, and memory alone put
    1,726 trials on the 139.8 GiB card (share 0.0005); that 16-CPU machine runs 16 of them at once. Here
    with exactly 0.06 GiB."""
    peak, card = int(0.06 * GIB), int(139.8 * GIB)
    assert gp.trials_per_card(peak, card) == 1864
    assert gp.concurrent_trials(16, 1.0) == 16 and gp.concurrent_trials(16, 3) == 5
    assert gp.concurrent_trials(2, 4) == 1 and gp.concurrent_trials(None, 1.0) is None
    assert gp.concurrent_trials(16, 1.0, max_concurrent=4) == 4 and gp.concurrent_trials(None, 1.0, 4) == 4
    assert gp.sharing_trials(peak, card, max_trials=16) == (16, 1864)
    assert gp.packed_share(peak, card, max_trials=16) == gp.gpu_fraction(16) == 0.0625
    assert gp.packing_line(peak, card, max_trials=16) == (
        "resources.gpu: auto = 0.0625: a trial peaks at 0.06 GiB of GPU memory in a dry round, so 16 trials share "
        "each 139.8 GiB card (20% kept free; memory fits 1864, 16 run at once)")
    # a larger trial: memory is the limit, and the line says no more
    assert gp.packing_line(10 * GIB, 80 * GIB, max_trials=16) == gp.packing_line(10 * GIB, 80 * GIB)
    assert gp.packed_share(10 * GIB, 80 * GIB, max_trials=16) == gp.gpu_fraction(6)


def test_oom_line_names_the_memory_needed_and_the_share():
    err = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.50 GiB. GPU 0 has a total capacity of "
                                 "79.19 GiB of which 1.1 GiB is free.")
    assert gp.needed_bytes(err) == int(2.5 * GIB)
    assert gp.needed_bytes(RuntimeError("no size here")) is None
    line = gp.oom_line(gp.needed_bytes(err), 80 * GIB, 0.25, measured_peak=10 * GIB)
    assert "\n" not in line
    assert line == ("out of GPU memory: the trial needed 2.50 GiB more than its share left, 0.25 of a 80.0 GiB "
                    "card (the dry round peaked at 10.00 GiB); set resources.gpu to a larger share (e.g. 0.5) or "
                    "lower fl.batch_size / runtime.client_chunk")


def test_parsing_measures_nothing_and_resolving_auto_is_one_explicit_step(tmp_path, monkeypatch):
    """Issue 38: parsing a space is pure (a space with `gpu: auto` is parsed by views, by `--help`-fast
    commands and twice by a search); the driver resolves `auto` once, explicitly, before trials run."""
    monkeypatch.setattr(gp, "measure_peak_bytes", lambda exp: pytest.fail("parsing measured"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump({"study": "t", "base": {"fl": {"rounds": 3}}, "resources": {"gpu": "auto"},
                                    "params": {"fl.lr": {"type": "float", "low": 0.01, "high": 0.1}}}))
    space = load_space(path)
    assert space.resources.gpu == "auto" and space.resources.auto_line is None
    with pytest.raises(RuntimeError, match="not resolved yet"):
        space.resources.gpu_share  # noqa: B018 - nothing reads an unresolved share as a number
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert space.resolve_resources() is space
    assert space.resources.gpu == space.resources.gpu_share == 0.0
    assert space.resources.auto_line == "resources.gpu: auto = 0: no CUDA GPU on this machine, trials train on the CPU"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: pytest.fail("resolved twice"))
    space.resolve_resources()  # idempotent
    assert space.resources.gpu == 0.0
    assert "AUTOFL_GPU_AUTO" not in os.environ  # nothing is handed to other processes through the environment


def test_a_fixed_share_is_kept(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump({"study": "t", "base": {}, "resources": {"gpu": 0.5},
                                    "params": {"fl.lr": {"type": "float", "low": 0.01, "high": 0.1}}}))
    space = load_space(path)
    assert space.resources.gpu == 0.5 and space.resources.auto_line is None


def test_a_trial_out_of_gpu_memory_fails_with_one_line():
    from autofl.tuning.tune.trainable import TrialOutOfGPUMemory

    err = TrialOutOfGPUMemory(torch.device("cpu"), torch.OutOfMemoryError("CUDA out of memory. Tried to allocate "
                                                                          "512.00 MiB."))
    assert str(err).startswith("out of GPU memory: the trial needed 0.50 GiB more than its share left")
    assert "\n" not in str(err)


def test_the_out_of_memory_line_is_built_in_a_ray_driver_too(monkeypatch):
    """In a process where Ray runs as the driver (an in-process `autofl.search` before it), asking for
    a worker's assigned resources raised an AssertionError; outside a worker the share is the whole card."""
    import types

    import ray

    from autofl.tuning.tune.trainable import TrialOutOfGPUMemory

    def assigned():
        raise AssertionError("This method is only available when the process is a worker.")

    driver = types.SimpleNamespace(worker=types.SimpleNamespace(mode=ray.SCRIPT_MODE), get_assigned_resources=assigned)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: driver)
    err = TrialOutOfGPUMemory(torch.device("cpu"), torch.OutOfMemoryError("CUDA out of memory. Tried to allocate "
                                                                          "512.00 MiB."))
    assert str(err).startswith("out of GPU memory: the trial needed 0.50 GiB more than its share left, 1 of a")
