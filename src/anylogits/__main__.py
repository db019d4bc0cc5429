"""``python -m anylogits``: the same as the ``anylogits`` command."""

import sys

from anylogits.cli import main

sys.exit(main())
