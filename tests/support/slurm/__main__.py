"""Entry point of ``python -m tests.support.slurm``."""

import sys

from .cli import main

sys.exit(main())
