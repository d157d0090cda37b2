"""``python -m attnlab``: the command line (see :mod:`attnlab.cli`)."""

from attnlab.cli import main

raise SystemExit(main())
