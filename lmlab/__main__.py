"""``python -m lmlab ...`` runs the ``lmlab`` command line."""

import sys

from lmlab.cli import main

sys.exit(main())
