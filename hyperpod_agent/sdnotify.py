"""systemd's notify protocol (Type=notify: READY=1, WATCHDOG=1, STOPPING=1), without
a dependency: one datagram to $NOTIFY_SOCKET. A no-op outside systemd."""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)


def sd_notify(state: str) -> bool:
    """Send ``state`` to systemd if it listens; True when sent."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return False
    address = "\0" + path[1:] if path.startswith("@") else path
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
        return True
    except OSError as exc:
        log.warning("sd_notify %s failed: %s", state, exc)
        return False
