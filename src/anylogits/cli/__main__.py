"""``python -m anylogits.cli``: the same as the ``anylogits`` command."""

import sys

from anylogits.cli import main

sys.exit(main())
