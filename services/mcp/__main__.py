import asyncio
import os
import sys

# gRPC's C core logs to stderr; over stdio, stdout is the protocol and stderr the client's log.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

from services.mcp.cli import main  # after GRPC_VERBOSITY: gRPC reads it on import

sys.exit(asyncio.run(main(sys.argv[1:])))
