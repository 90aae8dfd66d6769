"""The runner: ``./run up`` (all-in-one), ``serve``, ``pass``, ``rebuild-index``, ``demo``."""
