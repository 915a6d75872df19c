"""`python -m cadeloop`: the same as the `cadeloop` command."""

import sys

from .cli import main

sys.exit(main())
