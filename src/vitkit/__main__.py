"""`python -m vitkit`: the same as the `vitkit` command."""

import sys

from vitkit.cli import main

sys.exit(main())
