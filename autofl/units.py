"""Cost figures as people read them (status, the report): bytes in B / kB / MB / GB, FLOPs in
k / M / G / T / P, decimal prefixes (1 MB = 1e6 bytes, as network traffic is counted). No torch."""

from __future__ import annotations

import math

_PREFIXES = ("", "k", "M", "G", "T", "P", "E")


def _scaled(value: float, unit: str) -> str:
    if not math.isfinite(value):
        return str(value)
    step = 0
    while abs(value) >= 1000 and step < len(_PREFIXES) - 1:
        value /= 1000
        step += 1
    return f"{value:.0f} {unit}" if step == 0 else f"{value:.3g} {_PREFIXES[step]}{unit}"


def format_bytes(value: float | None) -> str:
    """`1234567` -> `1.23 MB`; None -> `-`."""
    return "-" if value is None else _scaled(float(value), "B")


def format_flops(value: float | None) -> str:
    """`3.2e9` -> `3.2 GFLOP`; None -> `-`."""
    return "-" if value is None else _scaled(float(value), "FLOP")
