"""Write autofl/builtin_listing.json: the rows `autofl list` shows for the built-in methods, models
and datasets, under a hash of the sources they are read from, so that the first `autofl list` after
an install without plugins imports no torch. Run it after changing a built-in method, model or
dataset (tests/test_startup_imports.py fails until the shipped rows match the live ones):

    python scripts/write_builtin_listing.py
"""

from __future__ import annotations

from autofl.listing import write_builtin_rows

if __name__ == "__main__":
    print(f"wrote {write_builtin_rows()}")
