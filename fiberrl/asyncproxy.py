"""Asynchronous manager calls: methods that return futures.

A stdlib proxy waits for each reply before the next call, so stepping 64 remote
environments one after the other costs 64 round trips. :class:`AsyncProxy` wraps a
proxy and gives it its own connection to the server (so the server serves it from
its own thread); a call sends the request and returns an :class:`AsyncProxyResult`
at once (a ``concurrent.futures.Future`` with ``multiprocessing``'s ``AsyncResult``
API: ``handle.get()``, as Uber Fiber's async proxies return), and a receiver thread
of this process resolves them as replies arrive. Calls on one ``AsyncProxy`` run in
the order they were made; calls on different ones run concurrently::

    envs = [manager.CartPole() for _ in range(64)]          # from an AsyncManager
    observations = gather([env.step(action) for env in envs])
    observation = envs[0].reset().get(timeout=10)

Threads and sockets: each ``AsyncProxy`` owns one connection (made on its first
call); the receiver thread owns the selector over all of them and is the only reader.
A connection closed by the caller, by a dropped proxy or by the exit hook ends its
channel quietly, so no drop order prints anything at exit.

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

from . import errors
from ._sync.connections import open_connection
from ._sync.proxies import AutoProxy, refuse_if_server_ended
from ._sync.serving import BaseManager, dispatch
from .errors import ManagerConnectionError

logger = logging.getLogger(__name__)


class AsyncProxyResult(concurrent.futures.Future):
    """The result of one call on an :class:`AsyncProxy`.

    It is a ``concurrent.futures.Future`` (``result()``, ``done()``,
    ``add_done_callback()``, ``concurrent.futures.wait``...) and has the API of
    ``multiprocessing.pool.AsyncResult`` too (``get``, ``ready``, ``wait``,
    ``successful``), which Uber Fiber's async proxies returned. A call cannot be
    cancelled once sent: ``cancel()`` returns False.
    """

    def get(self, timeout: Optional[float] = None) -> Any:
        """The call's result; raises its exception (a remote error as the stdlib's
        proxies raise it, :class:`~fiberrl.ManagerConnectionError` if the server is gone),
        or ``multiprocessing.TimeoutError`` if it is not done within ``timeout`` s."""
        self.wait(timeout)
        if not self.done():
            raise errors.TimeoutError(f"no reply within {timeout} s")   # multiprocessing's
        return self.result()

    def ready(self) -> bool:
        """True once the call has a result or an exception."""
        return self.done()

    def wait(self, timeout: Optional[float] = None) -> None:
        """Block until the call is done or ``timeout`` seconds passed."""
        concurrent.futures.wait((self,), timeout)

    def successful(self) -> bool:
        """True if the call returned without an exception; ValueError if not done yet."""
        if not self.done():
            raise ValueError(f"{self!r} not ready")
        return self.exception() is None


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
            key = self._selector.get_key(channel.fd)
        except (KeyError, ValueError, OSError):
            return
        if key.data is channel:   # (its descriptor may be another channel's by now)
            try:
                self._selector.unregister(channel.fd)
            except (KeyError, ValueError, OSError):
                pass

    def _run(self) -> None:
        while True:
            # epoll sees channels registered while it waits; the timeout covers other selectors
            self._serve(self._selector.select(0.5))

    @staticmethod
    def _serve(ready: list) -> None:
        """Read the replies of the ``ready`` channels. (A function of its own, so that no
        name of the thread's loop keeps the last channel, its proxy and its manager
        alive after the program dropped them.)"""
        for key, _events in ready:
            channel: _Channel = key.data
            try:
                # replies read off the socket together (none once the channel closed)
                while channel.on_readable() and channel.more_to_read():
                    pass
            except Exception:  # a bug: one broken channel must not stop the others
                logger.exception("async manager channel failed; dropping it")
                channel.fail(ManagerConnectionError("the asynchronous channel failed"))


_receiver: Optional[_Receiver] = None
_receiver_lock = threading.Lock()


def _the_receiver() -> _Receiver:
    global _receiver
    with _receiver_lock:
        if _receiver is None:
            _receiver = _Receiver()
        return _receiver


class _Channel:
    """A connection of its own to the server of one proxy, with requests in flight.

    Its connection may be closed under the receiver's feet: by :meth:`close`, by the
    proxy being dropped, or by the process's exit hook that closes every connection a
    server thread serves (``fiberrl._sync.connections``). The receiver then reads an
    error or nothing; either ends the channel quietly, failing calls still in flight.
    """

    def __init__(self, proxy: Any) -> None:
        token = proxy._token
        self.proxy = proxy
        refuse_if_server_ended(proxy._manager, token.address)
        self.conn = open_connection(token.address, proxy._authkey, proxy._serializer)
        name = f"{threading.current_thread().name}|async"
        dispatch(self.conn, None, "accept_connection", (name,))
        self.conn.mark_serving()
        self.fd = self.conn.fileno()
        self.lock = threading.Lock()
        self.pending: Deque[AsyncProxyResult] = collections.deque()
        self.failure: Optional[BaseException] = None
        _the_receiver().watch(self)

    def call(self, method: str, args: tuple, kwargs: dict) -> AsyncProxyResult:
        future = AsyncProxyResult()
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
        """Resolve the oldest pending call with the reply; False once the channel is done."""
        if self.failure is not None:
            return False
        try:
            kind, result = self.conn.recv()
        except (ManagerConnectionError, OSError, EOFError) as exc:
            self.fail(exc if isinstance(exc, ManagerConnectionError)
                      else ManagerConnectionError(f"the asynchronous channel was closed ({exc})"))
            return False
        with self.lock:
            future = self.pending.popleft() if self.pending else None
        if future is None:   # no call of ours asked for it: a server bug, not the caller's
            logger.warning("async manager channel: a reply with no call in flight (%s); "
                           "dropped", kind)
            return True
        if kind == "#RETURN":
            future.set_result(result)
        elif kind == "#PROXY":
            try:
                future.set_result(self._proxy_for(result))
            except Exception as exc:
                future.set_exception(exc)
        else:
            future.set_exception(mp_managers.convert_to_error(kind, result))
        return True

    def more_to_read(self) -> bool:
        """Whether another reply (or the end) can be read now without waiting."""
        try:
            return self.failure is None and not self.conn.closed and self.conn.poll(0)
        except (OSError, EOFError):   # closed meanwhile: the next read says so
            return self.failure is None

    def _proxy_for(self, result: Any) -> Any:
        exposed, token = result
        token.address = self.proxy._token.address
        manager = self.proxy._manager
        proxytype = manager._registry[token.typeid][-1] if manager else AutoProxy
        proxy = proxytype(token, self.proxy._serializer, manager=manager,
                          authkey=self.proxy._authkey, exposed=exposed)
        conn = open_connection(token.address, self.proxy._authkey, self.proxy._serializer)
        try:
            dispatch(conn, None, "decref", (token.id,))
        finally:
            conn.close()
        return proxy

    def fail(self, exc: BaseException) -> None:
        """Fail every call in flight with ``exc`` and close the channel (any thread)."""
        with self.lock:
            if self.failure is None:
                self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        """Fail every call in flight and close (the lock is held)."""
        self.failure = exc
        while self.pending:
            self.pending.popleft().set_exception(exc)
        _the_receiver().forget(self)  # before the descriptor can be reused
        self.conn.close()

    def close(self) -> None:
        self.fail(ManagerConnectionError("this asynchronous proxy was closed"))


class AsyncProxy:
    """A proxy whose exposed methods return :class:`AsyncProxyResult` handles (each a
    ``concurrent.futures.Future`` with ``multiprocessing``'s ``AsyncResult`` API too).

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
                    ) -> AsyncProxyResult:
        """Call ``method`` on the remote object; return a future of its result
        (the stdlib proxies' ``_callmethod``, asynchronous)."""
        with self._channel_lock:
            if self._channel is None:
                self._channel = _Channel(self.sync)
            channel = self._channel
        return channel.call(method, tuple(args), dict(kwds or {}))

    def _forward(self, method: str, *args: Any, **kwargs: Any) -> AsyncProxyResult:
        return self._callmethod(method, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        # (only attributes not found on the class get here; ``_exposed`` is looked up
        # through ``__dict__`` so that an instance being built or unpickled has none)
        exposed = self.__dict__.get("_exposed", ())
        if name not in exposed:
            kind = type(self.__dict__.get("sync")).__name__
            raise AttributeError(f"{kind} exposes no method {name!r} (exposed: "
                                 f"{sorted(exposed)})")
        return functools.partial(self._forward, name)

    # Subscripts, as Uber Fiber's async proxy types made them for an exposed
    # ``__getitem__``...: each returns the call's handle. (``len()``, ``in``, ``bool()``
    # and iteration are not forwarded: Python would turn the handle into a wrong int or
    # bool. Call ``__len__()`` or ``__contains__(x)`` by name for a handle.)
    def __getitem__(self, key: Any) -> AsyncProxyResult:
        return self._subscript("__getitem__", key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._subscript("__setitem__", key, value).add_done_callback(_log_failure)

    def __delitem__(self, key: Any) -> None:
        self._subscript("__delitem__", key).add_done_callback(_log_failure)

    def _subscript(self, method: str, *args: Any) -> AsyncProxyResult:
        if method not in self._exposed:
            raise TypeError(f"{type(self.sync).__name__} does not expose {method} "
                            f"(exposed: {sorted(self._exposed)})")
        return self._callmethod(method, args)

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


def _log_failure(handle: AsyncProxyResult) -> None:
    """An assignment or deletion has no handle to raise from: its failure is logged."""
    if handle.exception() is not None:
        logger.warning("an asynchronous item assignment or deletion failed: %r",
                       handle.exception())


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


class AsyncManager(BaseManager):
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
