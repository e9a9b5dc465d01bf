"""``python -m korch`` runs the command line."""

import sys

from korch.cli import main

sys.exit(main())
