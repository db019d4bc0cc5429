import sys
from pathlib import Path

# The repository's test fixtures (test_support: probes, native samplers) do not ship with
# the package asv installs; they are read from this checkout, as pytest reads them.
_REPOSITORY_ROOT = str(Path(__file__).resolve().parents[2])
if _REPOSITORY_ROOT not in sys.path:
    sys.path.append(_REPOSITORY_ROOT)
