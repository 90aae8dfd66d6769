import asyncio
import os
import sys
import warnings

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
