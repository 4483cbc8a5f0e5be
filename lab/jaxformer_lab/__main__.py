"""`python -m jaxformer_lab ...`: the `jaxformer` command with the lab's plugin, for a
checkout used without installing (PYTHONPATH=.:lab); the runs it starts load it too."""

import os

os.environ.setdefault("JAXFORMER_PLUGINS", "jaxformer_lab.plugin")

from jaxformer.cli import main  # noqa: E402

raise SystemExit(main())
