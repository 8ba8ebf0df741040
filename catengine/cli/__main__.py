"""``python -m catengine.cli ...``: the same as the ``catengine`` command."""
import sys

from . import main

sys.exit(main())
