"""`python -m autofl ...`: the same commands as the `autofl` script."""

import sys

from autofl.cli import main

sys.exit(main())
