"""`python -m harness ...`: see harness/cli/."""

import sys

from harness.cli import main

sys.exit(main())
