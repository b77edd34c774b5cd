"""`python -m loadax_mesh ...` runs the `loadax-mesh` command line."""

import sys

from .cli.main import main

sys.exit(main())
