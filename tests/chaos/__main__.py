"""Entry point: ``python -m tests.chaos [--short] [--events N] [--out FILE]``."""

import sys

from tests.chaos.run import main

sys.exit(main())
