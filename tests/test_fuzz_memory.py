"""Fuzzing the inputs that size memory (issue 42): random search-space params (wide ranges, tiny
steps, every sampler kind) and random .npz archives (declared shapes up to 10**12 rows, dtypes,
truncated or inflated entries, labels past int64). Each is validated under a memory ceiling (the
process's address space may grow by 1 GiB at most) and its Python allocations must peak under
64 MiB (a space once it validated; an archive as it loads): a space's or an array's size is checked before anything of that size is made, so each ends
valid or in one line (ConfigError / DataError), never a MemoryError or a traceback."""

from __future__ import annotations

import io
import tempfile
import zipfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autofl.errors import AutoFLError
from bounded_memory import memory_ceiling

PEAK = 64 << 20
KINDS = ["random", "tpe", "gp", "cmaes", "qmc", "grid"]
BOUNDS = st.one_of(st.integers(1, 64), st.integers(1, 10**15), st.floats(1e-6, 1.0), st.floats(1.0, 1e300))
STEPS = st.one_of(st.none(), st.sampled_from([1e-300, 1e-12, 1e-6, 0.001, 0.5, 1, 7]), st.floats(1e-15, 10.0))
KEYS = {"fl.lr": "float", "fl.batch_size": "int", "fl.rounds": "int", "fl.momentum": "float", "fl.eval_every": "int"}


@st.composite
def params(draw) -> dict:
    out = {}
    for key in draw(st.lists(st.sampled_from(sorted(KEYS)), min_size=1, max_size=4, unique=True)):
        low, high = sorted([draw(BOUNDS), draw(BOUNDS)])
        kind = KEYS[key] if draw(st.integers(0, 4)) else draw(st.sampled_from(["float", "int"]))
        spec = {"type": kind, "low": int(low) if kind == "int" else float(low),
                "high": int(high) if kind == "int" else float(high)}
        step = draw(STEPS)
        if step is not None:
            spec["step"] = max(1, int(step)) if kind == "int" else step
        out[key] = spec
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(params=params(), kind=st.sampled_from(KINDS), trials=st.integers(1, 100_000))
def test_any_space_is_sized_without_listing_it(params, kind, trials):
    from autofl.tuning.strategy.space import grid_size, parse_space
    from autofl.tuning.strategy.build import make_sampler

    raw = {"study": "fz", "trials": trials, "sampler": {"kind": kind}, "base": {"fl": {"rounds": 2}}, "params": params}
    with memory_ceiling(trace=False):  # a listed space: MemoryError at the ceiling, in seconds
        space = None
        try:
            space = parse_space(raw, "space.yaml")
        except AutoFLError as err:
            assert "\n" not in str(err)
    if space is None:
        return
    with memory_ceiling(trace=False):
        grid_size(space)  # what skip_repeats asks at every proposal, under every sampler
    if kind == "grid":
        with memory_ceiling() as ceiling:
            make_sampler(space)  # Optuna's GridSampler lists every config: only a bounded grid gets here
        assert ceiling.peak < PEAK, (params, kind, ceiling.peak)


def _npy(shape, dtype: str, body: bytes | None) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False, "shape": shape})
    return buf.getvalue() + (body if body is not None else b"")


DIMS = st.one_of(st.integers(0, 40), st.sampled_from([10**6, 10**9, 10**12]))
DTYPES = st.sampled_from(["<f4", "<f8", "<i8", "<u8", "|u1", "|b1", "<c8", "|O", "<U3"])


@st.composite
def archives(draw) -> dict[str, bytes]:
    entries = {}
    rows = draw(DIMS)
    for name, ndim in (("x", draw(st.integers(1, 4))), ("y", 1), ("client", 1)):
        if name == "client" and draw(st.booleans()):
            continue
        shape = (rows if draw(st.integers(0, 5)) else draw(DIMS),) + tuple(draw(DIMS) for _ in range(ndim - 1))
        dtype = draw(DTYPES) if name == "x" else draw(st.sampled_from(["<i8", "<u8", "<i4", "<f4", "|O"]))
        itemsize = np.dtype(dtype).itemsize if dtype != "|O" else 8
        full = int(np.prod(shape, dtype=object)) * itemsize
        if full <= 1 << 16 and draw(st.integers(0, 3)):  # real data of the declared size, labels possibly huge
            if name != "x" and dtype == "<u8" and draw(st.booleans()):
                body = np.full(shape, 2**63 + draw(st.integers(0, 5)), dtype=np.uint64).tobytes()
            else:
                body = draw(st.binary(min_size=full, max_size=full)) if full <= 512 else bytes(full)
        else:  # a header alone, a short body, or a stream of zeros that inflates far past the file
            body = draw(st.sampled_from([b"", bytes(64), bytes(1 << 20)]))
        entries[f"{name}.npy"] = _npy(shape, dtype, body)
    if draw(st.booleans()):
        entries["x.npy"] = entries.get("x.npy", b"")[: draw(st.integers(0, 120))]  # a cut header
    return entries


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entries=archives())
def test_any_npz_is_checked_before_it_is_read(entries):
    from autofl.experiment import load_experiment

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "data.npz"
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            for name, data in entries.items():
                archive.writestr(name, data)
        with memory_ceiling() as ceiling:
            try:
                load_experiment(None, ["data.dataset=npz", f"data.path={path}", "data.num_clients=1",
                                       "data.split.train=1", "data.split.val=0", "data.split.test=0"])
            except AutoFLError as err:
                assert "\n" not in str(err) and "data.path" in str(err), str(err)
        assert ceiling.peak < PEAK, ({k: len(v) for k, v in entries.items()}, ceiling.peak)
