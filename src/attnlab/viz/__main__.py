"""``python -m attnlab.viz <command> ...``: the ``attnlab viz`` commands without the main CLI."""

from attnlab.viz.cli import main

raise SystemExit(main())
