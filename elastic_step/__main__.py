"""``python -m elastic_step``: the same as the ``elastic-step`` command."""

import sys

from elastic_step.cli import main

sys.exit(main())
