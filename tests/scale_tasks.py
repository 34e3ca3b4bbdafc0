"""Task functions for test_pool_scale.py (workers import this module by name)."""
import os
import time


def hang_up_once(marker_dir, index):
    """First attempt: cut this worker's connection to its pool and hang (a job on a lost
    node, seen from the master); later attempts return ``index``."""
    marker = os.path.join(marker_dir, str(index))
    if not os.path.exists(marker):
        open(marker, "w").close()
        import socket
        from fiberrl.pool import worker
        worker._current.conn.stream.sock.shutdown(socket.SHUT_RDWR)
        time.sleep(60)
    return index
