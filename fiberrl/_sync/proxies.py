"""The proxies of fiberrl's managers: the stdlib's proxy classes on fiberrl's connections.

Each proxy class is the stdlib's with :class:`_FiberrlProxy` mixed in: a thread's
first call opens its own :class:`~.connections.ServerConnection` (served by a thread
of its own in the server), every call is one request and one reply on it, and the
bookkeeping goes through :class:`~.loopback.ClientFactory`. In the process that
serves it, a referent whose server allows it is called in the caller's thread, with
no connection (:func:`.loopback.direct_referent`). The classes are public in
:mod:`fiberrl.managers`, where pickled proxies find them.
"""
from __future__ import annotations

import threading
from multiprocessing import managers as mp_managers
from multiprocessing import process as mp_process
from typing import Any, Dict, Optional

from . import loopback
from ..errors import ManagerConnectionError
from .connections import open_connection
from .loopback import ClientFactory, direct_referent, serving_thread

#: where the proxy classes are public (and importable, for pickling by reference)
_PUBLIC = "fiberrl.managers"

Token = mp_managers.Token
dispatch = mp_managers.dispatch
convert_to_error = mp_managers.convert_to_error


class _FiberrlProxy:
    """Mixed into the stdlib's proxy classes: fiberrl connections, fiberrl rebuilding."""

    @property
    def _Client(self):
        return ClientFactory.for_serializer(self._serializer)

    @_Client.setter
    def _Client(self, stdlib_client):
        """``BaseProxy.__init__`` assigns the stdlib's client; fiberrl's is used instead."""

    def _connect(self) -> None:
        """Open this thread's connection, served by a thread of its own in the server."""
        name = mp_process.current_process().name
        if threading.current_thread().name != "MainThread":
            name += "|" + threading.current_thread().name
        refuse_if_server_ended(self._manager, self._token.address)
        conn = open_connection(self._token.address, self._authkey, self._serializer)
        conn.in_turn = True
        dispatch(conn, None, "accept_connection", (name,))
        conn.mark_serving()
        self._tls.connection = conn

    #: ``(fork generation, referent, exposed)`` when this process's threads call the
    #: referent directly (:func:`.loopback.direct_referent`), False when they do not,
    #: None until looked up
    _direct: Any = None

    def _callmethod(self, methodname: str, args: tuple = (), kwds: Any = None) -> Any:
        """Call ``methodname`` on the referent; a copy of its result (the stdlib's, with
        the request and its reply one step on this thread's connection).

        A referent its server lets this process call directly is called in the calling
        thread (a server thread of this process still goes through a connection, so
        that the object tells its own client from this process's threads)."""
        direct = self._direct
        if direct is None or (direct and direct[0] != loopback.fork_generation):
            direct = self._direct = direct_referent(self._token) or False
        if direct and methodname in direct[2] and serving_thread.conn is None:
            return getattr(direct[1], methodname)(*args, **({} if kwds is None else kwds))
        try:
            conn = self._tls.connection
        except AttributeError:
            self._connect()
            conn = self._tls.connection
        kind, result = conn.call((self._id, methodname, args, {} if kwds is None else kwds))
        if kind == "#RETURN":
            return result
        if kind == "#PROXY":
            return self._rebuild_returned(result)
        raise convert_to_error(kind, result)

    def _rebuild_returned(self, result: Any) -> Any:
        """A proxy for an object a method returned as one (``method_to_typeid``)."""
        exposed, token = result
        proxytype = self._manager._registry[token.typeid][-1]
        token.address = self._token.address
        proxy = proxytype(token, self._serializer, manager=self._manager,
                          authkey=self._authkey, exposed=exposed)
        conn = self._Client(token.address, authkey=self._authkey)
        dispatch(conn, None, "decref", (token.id,))
        return proxy

    def __reduce__(self):
        reduced = super().__reduce__()
        if getattr(self, "_isauto", False):
            _rebuild, (_auto, token, serializer, kwds) = reduced
            return mp_managers.RebuildProxy, (AutoProxy, token, serializer, kwds)
        return reduced


def refuse_if_server_ended(manager: Any, address: Any) -> None:
    """Raise :class:`ManagerConnectionError` at once if ``manager`` (the proxy's, in the
    process that started its server) already knows that the server's job has ended:
    dialling the address of a container or host that is gone fails only after seconds
    (no route to host), once per call. Asks no backend (a Docker or Slurm status query
    per call would cost more than the call)."""
    popen = getattr(getattr(manager, "_process", None), "_popen", None)
    if popen is not None and popen.known_ended:
        code = popen.returncode
        raise ManagerConnectionError(
            f"the manager server at {address!r} is gone: its job ended"
            + ("" if code is None else f" (exit code {code})"))


def _fiberrl_proxy(stdlib_type: type, extra: Optional[dict] = None) -> type:
    """``stdlib_type`` with fiberrl's connections (a class importable from this module)."""
    name = stdlib_type.__name__
    cls = type(name, (_FiberrlProxy, stdlib_type), {"__module__": _PUBLIC, **(extra or {})})
    cls.__qualname__ = name
    return cls


def _iterate_all(self):
    return iter(self[:])


BaseProxy = _fiberrl_proxy(mp_managers.BaseProxy)
IteratorProxy = _fiberrl_proxy(mp_managers.IteratorProxy)
AcquirerProxy = _fiberrl_proxy(mp_managers.AcquirerProxy)
ConditionProxy = _fiberrl_proxy(mp_managers.ConditionProxy)
EventProxy = _fiberrl_proxy(mp_managers.EventProxy)
BarrierProxy = _fiberrl_proxy(mp_managers.BarrierProxy)
NamespaceProxy = _fiberrl_proxy(mp_managers.NamespaceProxy)
ValueProxy = _fiberrl_proxy(mp_managers.ValueProxy)
ListProxy = _fiberrl_proxy(mp_managers.ListProxy)
DictProxy = _fiberrl_proxy(mp_managers.DictProxy)
ArrayProxy = _fiberrl_proxy(mp_managers.ArrayProxy, {"__iter__": _iterate_all})
BaseListProxy = _fiberrl_proxy(mp_managers.BaseListProxy)
BasePoolProxy = _fiberrl_proxy(mp_managers.BasePoolProxy)
PoolProxy = _fiberrl_proxy(mp_managers.PoolProxy, {
    "_exposed_": mp_managers.PoolProxy._exposed_ + ("stats", "resize"),
    "stats": lambda self: self._callmethod("stats"),
    "resize": lambda self, processes: self._callmethod("resize", (processes,)),
})



class SemaphoreProxy(AcquirerProxy):
    """A semaphore's proxy, with ``get_value()`` as on ``multiprocessing.Semaphore``."""

    _exposed_ = AcquirerProxy._exposed_ + ("get_value",)

    def get_value(self) -> int:
        """The number of free permits."""
        return self._callmethod("get_value")


_STDLIB_TO_FIBERRL = {stdlib: ours for ours in (
    BaseProxy, IteratorProxy, AcquirerProxy, ConditionProxy, EventProxy, BarrierProxy,
    NamespaceProxy, ValueProxy, ListProxy, DictProxy, ArrayProxy, PoolProxy)
    for stdlib in ours.__mro__[2:3]}

_auto_types: Dict[tuple, type] = {}


def MakeProxyType(name: str, exposed: Any) -> type:
    """A proxy class forwarding each method named in ``exposed`` (fiberrl connections)."""
    key = (name, tuple(exposed))
    cls = _auto_types.get(key)
    if cls is None:
        stdlib_type = mp_managers.MakeProxyType(name, exposed)
        cls = type(name, (_FiberrlProxy, stdlib_type), {"__module__": _PUBLIC})
        _auto_types[key] = cls
    return cls


def AutoProxy(token: Token, serializer: str, manager: Any = None, authkey: Optional[bytes] = None,
              exposed: Any = None, incref: bool = True, manager_owned: bool = False):
    """A proxy whose methods are those the server exposes for ``token``'s object."""
    if authkey is None and manager is not None:
        authkey = manager._authkey
    if authkey is None:
        authkey = mp_process.current_process().authkey
    if exposed is None:
        conn = open_connection(token.address, authkey, serializer)
        try:
            exposed = dispatch(conn, None, "get_methods", (token,))
        finally:
            conn.close()
    proxy_type = MakeProxyType(f"AutoProxy[{token.typeid}]", exposed)
    proxy = proxy_type(token, serializer, manager=manager, authkey=authkey, incref=incref,
                       manager_owned=manager_owned)
    proxy._isauto = True
    return proxy


def as_fiberrl_proxy_type(proxytype: Any) -> Any:
    if proxytype is None or proxytype is mp_managers.AutoProxy:
        return AutoProxy
    proxytype = _STDLIB_TO_FIBERRL.get(proxytype, proxytype)
    if (isinstance(proxytype, type) and issubclass(proxytype, mp_managers.BaseProxy)
            and not issubclass(proxytype, _FiberrlProxy)):
        _adopt_proxy_class(proxytype)
    return proxytype


def _adopt_proxy_class(cls: type) -> None:
    """Make a user's subclass of the stdlib's ``BaseProxy``, registered with a fiberrl
    manager, connect over fiberrl's wire (its servers speak no other protocol).

    The class is changed in place (a new class would not be importable where its
    proxies are unpickled); proxies of it then reach fiberrl managers only.
    """
    cls._Client = _FiberrlProxy.__dict__["_Client"]
    cls._connect = _FiberrlProxy.__dict__["_connect"]
