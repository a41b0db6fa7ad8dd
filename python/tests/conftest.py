"""The tests import the package from this checkout (python/), not an installed one."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
