"""The sync server: manager servers, their connections, and the objects they hold.

* :mod:`.connections` — a manager connection on fiberrl's wire;
* :mod:`.serving` — the server and ``BaseManager`` (and every name of the two below);
* :mod:`.proxies` — the proxies, one connection per thread;
* :mod:`.loopback` — how a client reaches a server of its own process without a socket;
* :mod:`.robust` — locks, semaphores and conditions that survive the death of the
  process holding them; :mod:`.robust_flags` — events and barriers, likewise;
* :mod:`.semlock` — the ``_semlock`` view the stdlib's queues read;
* :mod:`.cells` — ``Value``/``Array`` across hosts;
* :mod:`.coordination` — the in-process server behind ``fiberrl.Lock()``, ``Value()``...

The public modules (:mod:`fiberrl.managers`, :mod:`fiberrl.synchronize`,
:mod:`fiberrl.sharedctypes`) sit on top of this package; nothing here imports them.
"""
