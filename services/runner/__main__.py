import asyncio
import sys

from services.runner.cli import main

sys.exit(asyncio.run(main(sys.argv[1:])))
