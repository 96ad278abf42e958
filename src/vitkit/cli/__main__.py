"""`python -m vitkit.cli VERB ...` (as torchrun runs it: `torchrun ... -m vitkit.cli train`)."""

import sys

from vitkit.cli import main

sys.exit(main())
