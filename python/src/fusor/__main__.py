"""python -m fusor: the fusor CLI's main commands, through a scheduler."""

import sys

from ._cli import main

sys.exit(main())
