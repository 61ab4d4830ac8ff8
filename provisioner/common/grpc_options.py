"""gRPC channel options of the project's own long-lived channels (the front's to each cluster,
the shipped client's to the front). Standard library only: the client installs without the
servers' packages."""

from __future__ import annotations

# A fixed receive buffer, so the window a connection offers stays above one TCP segment.
# Linux sizes a window from the buffer and the bytes per packet seen so far: a connection of
# small calls offered about 52 KB, less than a loopback segment (about 64 KB). A larger answer
# (a page of a List) then waited for the sender's persist timer, at least 200 ms, and every call
# on the connection waited behind it (docs/performance.md). The kernel caps the size at
# net.core.rmem_max and doubles it; the memory is used only while data waits to be read.
RECEIVE_BUFFER = [("grpc.tcp_receive_buffer_size", 1 << 20)]
