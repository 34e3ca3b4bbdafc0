"""The runtime of a process: one I/O loop, one listener, the services on them.

* :mod:`.reactor` — the one event loop thread;
* :mod:`.acceptor` — the one listener: set-ups, proofs, routing by label;
* :mod:`.link` — an authenticated stream served by the loop;
* :mod:`.rpc` — named services and their clients;
* :mod:`.runtime` — the process-wide instance of all of the above;
* :mod:`.liveness` — the one mechanism by which jobs, parents and hosts are known gone;
* :mod:`.jobenv` — what a job learns from its environment.

Built on :mod:`fiberrl._wire`; the services that own queues, pipes and spawn sit on
top of it.
"""
