"""`python -m loadax_mesh ...` runs the `loadax-mesh` command line."""

import sys

from .cli import main

sys.exit(main())
