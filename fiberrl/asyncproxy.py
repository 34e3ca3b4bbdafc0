"""Asynchronous manager calls: methods that return futures.

A stdlib proxy waits for each reply before the next call, so stepping 64 remote
environments one after the other costs 64 round trips. :class:`AsyncProxy` wraps a
proxy and gives it its own connection to the server (so the server serves it from
its own thread); a call sends the request and returns a
``concurrent.futures.Future`` at once, and a receiver thread of this process
resolves futures as replies arrive. Calls on one ``AsyncProxy`` run in the order
they were made; calls on different ones run concurrently::

    envs = [manager.CartPole() for _ in range(64)]          # from an AsyncManager
    observations = gather([env.step(action) for env in envs])

:class:`AsyncManager` is a :class:`~fiberrl.managers.BaseManager` whose registered
types are created as ``AsyncProxy`` objects; :func:`asynchronous` wraps any proxy.
"""
from __future__ import annotations

import collections
import concurrent.futures
import functools
import logging
import selectors
import threading
from multiprocessing import managers as mp_managers
from typing import Any, Deque, Iterable, List, Optional

from . import managers
from .errors import ManagerConnectionError

logger = logging.getLogger(__name__)


class _Receiver:
    """One thread per process that reads replies for every async channel."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._thread = threading.Thread(target=self._run, name="fiberrl-async-replies", daemon=True)
        self._thread.start()

    def watch(self, channel: "_Channel") -> None:
        self._selector.register(channel.fd, selectors.EVENT_READ, channel)

    def forget(self, channel: "_Channel") -> None:
        """Stop watching ``channel`` (call before its connection is closed)."""
        try:
            self._selector.unregister(channel.fd)
        except (KeyError, ValueError, OSError):
            pass

    def _run(self) -> None:
        while True:
            # epoll sees channels registered while it waits; the timeout covers other selectors
            for key, _events in self._selector.select(0.5):
                channel: _Channel = key.data
                try:
                    alive = channel.on_readable()
                    # replies read off the socket together (none once the channel is closed)
                    while alive and not channel.conn.closed and channel.conn.poll(0):
                        alive = channel.on_readable()
                except Exception:  # one broken channel must not stop every other's replies
                    logger.exception("async manager channel failed; dropping it")
                    alive = False
                if not alive:
                    self.forget(channel)


_receiver: Optional[_Receiver] = None
_receiver_lock = threading.Lock()


def _the_receiver() -> _Receiver:
    global _receiver
    with _receiver_lock:
        if _receiver is None:
            _receiver = _Receiver()
        return _receiver


class _Channel:
    """A connection of its own to the server of one proxy, with requests in flight."""

    def __init__(self, proxy: Any) -> None:
        token = proxy._token
        self.proxy = proxy
        self.conn = managers.open_connection(token.address, proxy._authkey, proxy._serializer)
        name = f"{threading.current_thread().name}|async"
        managers.dispatch(self.conn, None, "accept_connection", (name,))
        self.conn.mark_serving()
        self.fd = self.conn.fileno()
        self.lock = threading.Lock()
        self.pending: Deque[concurrent.futures.Future] = collections.deque()
        self.failure: Optional[BaseException] = None
        _the_receiver().watch(self)

    def call(self, method: str, args: tuple, kwargs: dict) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_running_or_notify_cancel()
        with self.lock:
            if self.failure is not None:
                future.set_exception(self.failure)
                return future
            self.pending.append(future)
            try:
                self.conn.send((self.proxy._id, method, args, kwargs))
            except ManagerConnectionError as exc:
                self._fail(exc)
            except Exception as exc:  # the arguments could not be pickled: nothing was sent
                self.pending.remove(future)
                future.set_exception(exc)
        return future

    def on_readable(self) -> bool:
        """Resolve the oldest pending future with the reply; False once the channel is dead."""
        try:
            kind, result = self.conn.recv()
        except ManagerConnectionError as exc:
            with self.lock:
                self._fail(exc)
            return False
        with self.lock:
            future = self.pending.popleft()
        if kind == "#RETURN":
            future.set_result(result)
        elif kind == "#PROXY":
            future.set_result(self._proxy_for(result))
        else:
            future.set_exception(mp_managers.convert_to_error(kind, result))
        return True

    def _proxy_for(self, result: Any) -> Any:
        exposed, token = result
        token.address = self.proxy._token.address
        manager = self.proxy._manager
        proxytype = manager._registry[token.typeid][-1] if manager else managers.AutoProxy
        proxy = proxytype(token, self.proxy._serializer, manager=manager,
                          authkey=self.proxy._authkey, exposed=exposed)
        conn = managers.open_connection(token.address, self.proxy._authkey, self.proxy._serializer)
        try:
            managers.dispatch(conn, None, "decref", (token.id,))
        finally:
            conn.close()
        return proxy

    def _fail(self, exc: BaseException) -> None:
        """Fail every call in flight and close (the lock is held)."""
        self.failure = exc
        while self.pending:
            self.pending.popleft().set_exception(exc)
        _the_receiver().forget(self)  # before the descriptor can be reused
        self.conn.close()

    def close(self) -> None:
        with self.lock:
            if self.failure is None:
                self._fail(ManagerConnectionError("this asynchronous proxy was closed"))


class AsyncProxy:
    """A proxy whose exposed methods return ``concurrent.futures.Future`` objects.

    ``proxy`` is a manager proxy (it keeps the remote object alive). The wrapped
    proxy stays available as ``.sync`` for blocking calls.
    """

    def __init__(self, proxy: Any) -> None:
        self._channel = None
        if not isinstance(proxy, mp_managers.BaseProxy):
            raise TypeError(f"AsyncProxy wraps a manager proxy, not {type(proxy).__name__}")
        self.sync = proxy
        self._exposed = frozenset(getattr(proxy, "_exposed_", ()))
        self._channel_lock = threading.Lock()

    def _callmethod(self, method: str, args: tuple = (), kwds: Optional[dict] = None
                    ) -> concurrent.futures.Future:
        """Call ``method`` on the remote object; return a future of its result
        (the stdlib proxies' ``_callmethod``, asynchronous)."""
        with self._channel_lock:
            if self._channel is None:
                self._channel = _Channel(self.sync)
            channel = self._channel
        return channel.call(method, tuple(args), dict(kwds or {}))

    def _forward(self, method: str, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        return self._callmethod(method, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name not in self._exposed:
            raise AttributeError(f"{type(self.sync).__name__} exposes no method {name!r} "
                                 f"(exposed: {sorted(self._exposed)})")
        return functools.partial(self._forward, name)

    def _close(self) -> None:
        """Close this proxy's connection; calls still in flight fail. (Remote methods
        named ``close`` or ``call`` are forwarded like any other.)"""
        with self._channel_lock:
            if self._channel is not None:
                self._channel.close()
                self._channel = None

    def __reduce__(self):
        return AsyncProxy, (self.sync,)

    def __del__(self) -> None:
        channel = self.__dict__.get("_channel")
        if channel is not None:
            try:
                channel.close()
            except Exception:
                pass

    def __repr__(self) -> str:
        return f"<AsyncProxy of {self.sync!r}>"


def asynchronous(proxy: Any) -> AsyncProxy:
    """An :class:`AsyncProxy` view of ``proxy``."""
    return AsyncProxy(proxy)


def gather(futures: Iterable[concurrent.futures.Future], timeout: Optional[float] = None) -> List[Any]:
    """The results of ``futures`` in order; raises the first failure, or
    ``TimeoutError`` if they are not all done within ``timeout`` seconds."""
    futures = list(futures)
    done, not_done = concurrent.futures.wait(futures, timeout)
    if not_done:
        raise TimeoutError(f"{len(not_done)} of {len(futures)} calls not done after {timeout} s")
    return [future.result() for future in futures]


class AsyncManager(managers.BaseManager):
    """A manager whose registered types are created as :class:`AsyncProxy` objects.

    Register types as with any manager; ``manager.<typeid>(...)`` creates the object
    in the server and returns an ``AsyncProxy`` (its blocking proxy is ``.sync``).
    """

    @classmethod
    def register(cls, typeid: str, callable: Any = None, proxytype: Any = None,
                 exposed: Any = None, method_to_typeid: Optional[dict] = None,
                 create_method: bool = True) -> None:
        """Register ``typeid``; its create method returns an ``AsyncProxy``."""
        super().register(typeid, callable, proxytype, exposed, method_to_typeid, create_method)
        if create_method:
            create_sync = getattr(cls, typeid)

            def create_async(self, *args: Any, **kwargs: Any) -> AsyncProxy:
                return AsyncProxy(create_sync(self, *args, **kwargs))

            create_async.__name__ = typeid
            create_async.__doc__ = f"Create a {typeid} in the server; return an AsyncProxy."
            setattr(cls, typeid, create_async)
