"""The reflection workers. Each states its own applicability (``gate``) and runs under its own
failure isolation; a worker's prompt lives in ``services/reflector/prompts/`` and its offline rule
next to it, so the loop runs end to end with no model."""
