"""`python -m pieceworks.report --machine NAME`: see the package's docstring."""

import sys

from . import main

sys.exit(main())
