"""``python -m pgpgm.cli``: the ``pgpgm`` command."""

import sys

from .command import main

sys.exit(main())
