"""One registry pattern for methods, models and datasets: unknown names list what is registered,
a model's own parameters are validated like a method's, and installed plugins (entry points) are
registered with their distribution's name, or skipped with one line when they fail or collide."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pydantic import Field
from torch import nn

from autofl.errors import ConfigError
from autofl.experiment import load_experiment
from autofl.models.parts import build_model
from autofl.models.spec import LinearSpec, ModelParams, ModelSpec
from autofl.registry import BUILT_IN, DATASETS, METHODS, MODELS, USER

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("override, registry, builtins", [
    ("method.name=nope", METHODS, {"ditto", "dualfed", "fdcl", "fedavg", "fedprox", "fedper", "moon"}),
    ("model.arch=nope", MODELS, {"cnn", "mlp", "moon_cnn", "resnet18"}),
    ("data.dataset=nope", DATASETS, {"cifar10", "cifar100", "digits", "fmnist", "mnist", "npz"}),
])
def test_unknown_names_list_what_is_registered(override, registry, builtins):
    with pytest.raises(ConfigError) as info:
        load_experiment(None, [override])
    key = override.split("=")[0]
    line = f"{key}: unknown {registry.kind} 'nope'; allowed: {', '.join(registry.names())}"
    assert str(info.value).startswith(line) and "\n" not in str(info.value)
    assert builtins <= set(registry.names())


def test_builtins_come_from_one_registry_each():
    assert {"fedavg", "fedprox", "fedper"} <= set(METHODS.names())
    assert all(e.source == BUILT_IN for r in (METHODS, MODELS, DATASETS) for e in r.entries() if e.name in
               {"fedavg", "mlp", "resnet18", "digits", "npz"})
    assert MODELS.get("moon_cnn").linear_layers == 5 and DATASETS.get("cifar10").input_shape == (3, 32, 32)


class WideParams(ModelParams):
    hidden: int = Field(64, ge=1, le=4096, description="hidden width")


def _wide(input_shape, num_classes, params):
    return nn.Flatten(), [LinearSpec(64, params.hidden, True), LinearSpec(params.hidden, num_classes, False)]


@pytest.fixture
def wide_model():
    spec = MODELS.add(ModelSpec("wide_test", _wide, linear_layers=2, linear_only=True, Params=WideParams))
    yield spec
    MODELS.discard("wide_test")


def test_a_models_own_parameters_are_validated_and_filled(wide_model):
    assert MODELS.source("wide_test") == USER
    exp = load_experiment(None, ["model.arch=wide_test"])
    assert exp.model.params() == {"hidden": 64}  # the default, written into the resolved config
    exp = load_experiment(None, ["model.arch=wide_test", "model.hidden=32"])
    model = build_model(exp.model, exp.input_shape, exp.num_classes)
    assert model.encoder[1].out_features == 32 and model.head[0].in_features == 32
    with pytest.raises(ConfigError, match=r"model.hidden: Input should be less than or equal to 4096"):
        load_experiment(None, ["model.arch=wide_test", "model.hidden=5000"])
    with pytest.raises(ConfigError, match=r"model.width: unknown key for arch wide_test; allowed keys: arch, "
                                          r"head_layers, projector_depth, projector_dim, hidden"):
        load_experiment(None, ["model.arch=wide_test", "model.width=5"])
    with pytest.raises(ConfigError, match="model.hidden: unknown key for arch mlp"):
        load_experiment(None, ["model.hidden=5"])
    with pytest.raises(ValueError, match="model name 'mlp' is already registered"):
        MODELS.add(ModelSpec("mlp", _wide, linear_layers=2))


PLUGIN = {
    "fakeplug/__init__.py": "",
    "fakeplug/good.py": '''
        import math
        from pydantic import Field
        from torch import nn
        from autofl.data.spec import DatasetSpec, RawDataset
        from autofl.methods.base import Method, MethodParams
        from autofl.models.spec import LinearSpec, ModelParams, ModelSpec
        import torch

        class TinyParams(MethodParams):
            scale: float = Field(1.0, gt=0, le=10, description="loss scale")

        class Tiny(Method):
            """Tiny: FedAvg with a scaled loss."""
            name = "tiny"
            Params = TinyParams

            def loss(self, ws, x, y, flags):
                return self.params.scale * super().loss(ws, x, y, flags)

        class TinyModelParams(ModelParams):
            hidden: int = Field(16, ge=2, le=512)

        def _layers(shape, num_classes, params):
            flat = math.prod(shape)
            return nn.Flatten(), [LinearSpec(flat, params.hidden, True), LinearSpec(params.hidden, num_classes, False)]

        TINY_MLP = ModelSpec("tiny_mlp", _layers, linear_layers=2, linear_only=True, Params=TinyModelParams)

        def _load(cfg):
            g = torch.Generator().manual_seed(0)
            y = torch.arange(200) % 2
            x = torch.randn(200, 1, 1, 4, generator=g) + y.view(-1, 1, 1, 1).float()
            return RawDataset("tiny_data", x[:160], y[:160], x[160:], y[160:], 2)

        TINY_DATA = DatasetSpec("tiny_data", _load, num_classes=2, input_shape=(1, 1, 4), train_size=160,
                                test_size=40)
    ''',
    "fakeplug/broken.py": "raise ImportError('needs the frobnicate package')\n",
    "fakeplug/clash.py": '''
        from autofl.methods.base import Method

        class Clash(Method):
            name = "fedavg"
    ''',
    "autofl_test_plugins-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: autofl-test-plugins\nVersion: 0.1\n",
    "autofl_test_plugins-0.1.dist-info/entry_points.txt": '''
        [autofl.methods]
        tiny = fakeplug.good:Tiny
        fedavg = fakeplug.clash:Clash
        broken = fakeplug.broken:Whatever

        [autofl.models]
        tiny_mlp = fakeplug.good:TINY_MLP

        [autofl.datasets]
        tiny_data = fakeplug.good:TINY_DATA
    ''',
}


@pytest.fixture
def plugin_env(tmp_path):
    site = tmp_path / "site"
    for rel, text in PLUGIN.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(textwrap.dedent(text).lstrip())
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(site)])}


def _autofl(env, *args):
    return subprocess.run([sys.executable, "-m", "autofl.cli", *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=300)


def test_installed_plugins_are_listed_used_or_skipped_with_one_line(plugin_env, tmp_path):
    listed = _autofl(plugin_env, "list")
    assert listed.returncode == 0, listed.stderr
    rows = [" ".join(line.replace("│", " ").split()) for line in listed.stdout.splitlines()]
    assert any(r.startswith("tiny autofl-test-plugins Tiny: FedAvg with a scaled loss. scale: float = 1.0 in (0, 10]")
               for r in rows), listed.stdout
    assert any(r.startswith("tiny_mlp autofl-test-plugins head_layers 1..2 hidden: int = 16 in [2, 512]")
               for r in rows), listed.stdout
    assert any(r.startswith("tiny_data autofl-test-plugins 2 classes, input 1x1x4, 160 train / 40 test")
               for r in rows), listed.stdout
    assert any(r.startswith("fedavg built-in") for r in rows)  # the clash did not replace the built-in
    problems = [line for line in listed.stderr.splitlines() if line.strip()]
    assert len(problems) == 2, listed.stderr
    assert any("plugin 'fedavg' (autofl.methods) from distribution autofl-test-plugins skipped: ValueError: method "
               "name 'fedavg' is already registered (built-in)" in p for p in problems), problems
    assert any("plugin 'broken' (autofl.methods) from distribution autofl-test-plugins skipped: ImportError: needs "
               "the frobnicate package" in p for p in problems), problems

    out = tmp_path / "run"
    run = _autofl(plugin_env, "train", "--out", out, "--set", "method.name=tiny", "--set", "method.scale=2",
                  "--set", "model.arch=tiny_mlp", "--set", "model.hidden=8", "--set", "data.dataset=tiny_data",
                  "--set", "data.num_clients=4", "--set", "data.min_size=5", "--set", "fl.rounds=2")
    assert run.returncode == 0, run.stderr
    assert (out / "metrics.jsonl").read_text().count("\n") == 2


PLUGINS_PAGE = REPO / "docs" / "plugins.md"  # the docs page that holds the method plugin example


def _docs_block(after: str) -> str:
    text = PLUGINS_PAGE.read_text()
    start = text.index("```python\n", text.index(after)) + len("```python\n")
    return text[start:text.index("```", start)]


@pytest.fixture
def readme_method():
    namespace = {"__name__": "readme_prox_head"}
    exec(compile(_docs_block("## A method plugin"), "docs/plugins.md", "exec"), namespace)  # noqa: S102
    cls = METHODS.add(namespace["ProxHead"])
    yield cls
    METHODS.discard(cls.name)


def test_readmes_method_plugin_trains_the_same_under_both_executors(readme_method):
    from test_executor_equivalence import check_equivalent

    assert METHODS.source("prox_head") == USER
    exp = load_experiment(None, ["method.name=prox_head", "method.mu=0.5"])
    assert exp.method.params() == {"mu": 0.5}
    with pytest.raises(ConfigError, match=r"method.mu: Input should be less than or equal to 100"):
        load_experiment(None, ["method.name=prox_head", "method.mu=1000"])
    check_equivalent("prox_head", "mlp", "float64")


EXITING_PLUGIN = {
    "exitplug/__init__.py": "",
    "exitplug/quits.py": "import sys\nsys.exit(0)\n",
    "exitplug/raises_base.py": "raise GeneratorExit('odd')\n",
    "autofl_exit_plugin-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: autofl-exit-plugin\nVersion: 0.1\n",
    "autofl_exit_plugin-0.1.dist-info/entry_points.txt": '''
        [autofl.methods]
        quits = exitplug.quits:Quits
        odd = exitplug.raises_base:Odd
    ''',
}


def test_a_plugin_that_exits_at_import_is_one_line_and_the_command_still_runs(tmp_path):
    """Issue 42: `sys.exit(0)` in a plugin's module made every autofl command exit 0 silently."""
    site = tmp_path / "site"
    for rel, text in EXITING_PLUGIN.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(textwrap.dedent(text).lstrip())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(site)])}
    listed = _autofl(env, "list", "methods")
    assert listed.returncode == 0, listed.stderr
    assert "fedavg" in listed.stdout  # the command ran on
    problems = [line for line in listed.stderr.splitlines() if line.strip()]
    assert len(problems) == 2, listed.stderr
    assert any("plugin 'quits' (autofl.methods) from distribution autofl-exit-plugin skipped: SystemExit: "
               "the plugin's module exited at import (code 0)" in p for p in problems), problems
    assert any("plugin 'odd' (autofl.methods) from distribution autofl-exit-plugin skipped: GeneratorExit: odd"
               in p for p in problems), problems
