"""gRPC's fork handlers off for this process: import this module before anything imports gRPC.

gRPC's C core registers ``pthread_atfork`` handlers (``GRPC_ENABLE_FORK_SUPPORT``, on in the
grpcio wheels) that try to quiesce its poller around a ``fork()`` so a child can go on using
gRPC. We never use gRPC in a child: every child we start execs at once. And the handlers lose a
race: when another thread is inside gRPC at the moment of the fork they skip the quiesce, and the
child aborts on the inconsistent poller before it reaches ``exec``. Python forks (rather than
vforks) whenever a child runs as another user, which is exactly how the embedded PostgreSQL's
``pg_ctl`` is started when we are root: a server start died with SIGABRT, and ``./run up`` with it
(issue 14's CI, 2026-12-03; reproduced at 40% of forks with a busy gRPC server, 0% with this off).

gRPC reads the variable when it is imported, so setting it later does nothing. An operator's own
value wins (``setdefault``).
"""

from __future__ import annotations

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
