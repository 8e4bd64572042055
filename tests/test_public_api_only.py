"""autofl uses Ray, Optuna and torch through their public API only: no underscored attribute of
one of their objects, no import of a private module, no private keyword of `ray.init`. A new
Ray or Optuna release may move any of these without notice and silently break every study."""

from __future__ import annotations

import re
from pathlib import Path

import autofl

PACKAGE = Path(autofl.__file__).parent
# an underscored attribute read or written on a library object (or on a name that holds one here)
PRIVATE_ATTRIBUTE = re.compile(r"\b(ray|optuna|torch|tune|study|trial|searcher|bracket|storage|url|ot|ot_study)"
                               r"\._[A-Za-z]|\b(ray|optuna|torch|nn|F|tune)(\.\w+)+\._[A-Za-z]")
PRIVATE_IMPORT = re.compile(r"\b(from|import)\s+(ray|optuna|torch)(\.\w+)*\._\w")
PRIVATE_KWARGS = re.compile(r"\b_node_ip_address\b|\._replace\(")


def private_uses(text: str) -> list[str]:
    hits = []
    for number, line in enumerate(text.splitlines(), 1):
        code = line.split("#", 1)[0]
        for pattern in (PRIVATE_ATTRIBUTE, PRIVATE_IMPORT, PRIVATE_KWARGS):
            if pattern.search(code):
                hits.append(f"{number}: {line.strip()}")
    return hits


def test_the_patterns_catch_what_they_are_for():
    caught = ["from ray._private.worker import print_worker_logs", "study._storage.get_trial(1)",
              "trial._trial_id", "bracket._rungs", "ray.init(_node_ip_address='127.0.0.1')",
              "make_url(url)._replace(password=None)", "import optuna._imports", "searcher._ot_study.tell(0)",
              "torch._C._set_grad_enabled(True)",
              "nn.modules.batchnorm._BatchNorm", "optuna.samplers._tpe.sampler"]
    assert all(private_uses(line) for line in caught)
    assert not private_uses("self._storage = open_storage(url)  # our own attribute")
    assert not private_uses("optuna.trial.Trial(study, trial_id)")


def test_autofl_reads_no_private_name_of_ray_optuna_or_torch():
    found = {str(path.relative_to(PACKAGE.parent)): hits for path in sorted(PACKAGE.rglob("*.py"))
             if (hits := private_uses(path.read_text()))}
    assert not found, found
