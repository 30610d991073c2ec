"""``python -m memtrace`` runs the command line."""

import sys

from memtrace.cli import main

sys.exit(main())
