import gc
import sys

if sys.argv[1:2] == ["pass"]:
    # A one-shot pass (a CronJob pod's whole life) starts with no cyclic collection: what the
    # imports and the opening make lives as long as the process, and the collector walked it again
    # and again (about a tenth of the pass's CPU). cli._settled turns it on for the pass's work.
    gc.disable()

import asyncio
import os
import warnings

import libs.common.grpc_fork  # noqa: F401  (first: gRPC reads GRPC_ENABLE_FORK_SUPPORT on import)

# gRPC's C core logs its own errors to stderr (a taken port is two lines of it before ours); our
# logging says what matters. GRPC_VERBOSITY=ERROR (or DEBUG) brings it back.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")
# The embedded PostgreSQL's lock directory falls back to /tmp without a session's runtime dir: fine.
warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")

from services.runner.cli import main, quick_exit  # noqa: E402 (after GRPC_VERBOSITY: gRPC reads it on import)

code = asyncio.run(main(sys.argv[1:]))
if sys.argv[1:2] == ["pass"]:
    quick_exit(code)
sys.exit(code)
