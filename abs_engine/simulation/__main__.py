"""``python3 -m abs_engine.simulation``: run seeds (see the package docstring)."""

import sys

from .seeds import main

sys.exit(main())
