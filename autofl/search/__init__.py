"""The search side: study folders, the study ledger, the Ray Tune run, re-evaluation, the live view.

This package is also the public function `autofl.search(space, ...)`: Python binds a package's
name on its parent when the package is first imported, so `autofl.search` names this package
once any module of it has loaded. Calling it therefore runs `autofl.api.search` (the module class
below, defined beside autofl's other lazy exports, makes the package callable).
"""

from __future__ import annotations

import sys

from autofl import _CallableSearchPackage

sys.modules[__name__].__class__ = _CallableSearchPackage
