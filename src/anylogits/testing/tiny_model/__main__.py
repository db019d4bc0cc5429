import sys

from anylogits.testing.tiny_model.cli import main

sys.exit(main())
