"""The wire: every byte fiberrl puts on a socket goes through this package.

* :mod:`.auth` — the run's secret, set-up proofs, per-message MACs;
* :mod:`.framing` — the one message format, written and read;
* :mod:`.sockets` — where to listen, how to connect (Unix on one host, else TCP);
* :mod:`.stream` — an authenticated stream's set-up, :class:`~.stream.Stream`
  (blocking, for the thread that owns it) and :class:`~.stream.Channel` (for the
  event loop).

Nothing here imports the rest of fiberrl except :mod:`fiberrl.errors` (and the
configuration, for keepalive settings).
"""
