"""ZeroMQ transport: authenticated framing, the process-wide context, and RPC clients.

Wire format of every fiberrl message (a ZeroMQ multipart message)::

    [signature, header, body_0, body_1, ...]

``signature`` is HMAC-SHA256 under the run's secret over the header, the first body
frame (the pickle stream, when there is one) and the *lengths* of the other body
frames. A message whose signature does not verify is dropped before anything in it is
unpickled; that is the whole security argument, so every receive path goes through
:func:`recv`. The remaining body frames are raw out-of-band buffers (numpy data):
they are only ever used as buffers by an authenticated pickle stream, never
unpickled themselves, so they are length-checked but not hashed (hashing 16 MB costs
~14 ms here). The run's secret reaches jobs through their environment, never argv.

Threads and sockets: ZeroMQ sockets are not thread-safe, so every socket here has one
owning thread. :class:`HubClient` keeps one DEALER per calling thread.
"""
from __future__ import annotations

import hmac
import itertools
import logging
import os
import pickle
import secrets
import socket as _socket
import struct
import threading
import time
import weakref
from hashlib import sha256
from typing import Any, List, Optional, Sequence, Tuple


class _LazyZmq:
    """``zmq``, imported on first use: a job that never needs ZeroMQ (its calls go to
    the parent's stream door) does not pay for importing it."""

    def __getattr__(self, name: str) -> Any:
        import zmq as module
        globals()["zmq"] = module   # later uses in this module find the module itself
        return getattr(module, name)


zmq: Any = _LazyZmq()

logger = logging.getLogger(__name__)

SECRET_ENV = "FIBERRL_SECRET"
_SIG_BYTES = 32
_LEN = struct.Struct("!Q")

_state_lock = threading.Lock()
_context: Optional[zmq.Context] = None
_context_pid: Optional[int] = None
_secret: Optional[bytes] = None


def context() -> zmq.Context:
    """The process-wide ZeroMQ context (re-created in a forked child)."""
    global _context, _context_pid
    with _state_lock:
        if _context is None or _context_pid != os.getpid():
            _context = zmq.Context()
            _context_pid = os.getpid()
        return _context


def secret() -> bytes:
    """The run's shared secret: inherited from the parent job, or made fresh for a root process."""
    global _secret
    with _state_lock:
        if _secret is None:
            inherited = os.environ.get(SECRET_ENV)
            _secret = bytes.fromhex(inherited) if inherited else secrets.token_bytes(32)
        return _secret


def secret_env() -> dict:
    """Environment entries that hand the secret to a job."""
    return {SECRET_ENV: secret().hex()}


def _mac(header: bytes, body: Sequence[Any]) -> bytes:
    mac = hmac.new(secret(), header, sha256)
    if body:
        first = memoryview(body[0])
        mac.update(_LEN.pack(first.nbytes))
        mac.update(first)
        for frame in body[1:]:
            mac.update(_LEN.pack(memoryview(frame).nbytes))
    return mac.digest()


def send(sock: zmq.Socket, header: tuple, body: Sequence[Any] = (),
         identity: Optional[bytes] = None, flags: int = 0) -> None:
    """Sign and send one message; ``identity`` prefixes it for ROUTER sockets."""
    head = pickle.dumps(header, protocol=5)
    frames: List[Any] = [_mac(head, body), head, *body]
    if identity is not None:
        frames.insert(0, identity)
    # Views of caller-owned memory (numpy data) are copied by ZeroMQ before send()
    # returns, so the caller may change an array at once. Immutable bytes go without
    # a copy; jobs flush their sockets before they exit (flush_and_close), so no queued
    # message outlives the memory it points into.
    zero_copy = all(isinstance(f, bytes) for f in body)
    sock.send_multipart(frames, flags=flags, copy=not zero_copy)


def flush_and_close(linger: float = 5.0) -> None:
    """Deliver what this process still has queued (up to ``linger`` s), then close
    every socket. Called when a job ends, after its children were joined."""
    global _context
    with _state_lock:
        ctx, _context = _context, None
    if ctx is not None and _context_pid == os.getpid():
        for sock in list(_monitored):
            if not sock.closed:
                try:
                    sock.disable_monitor()  # else closing it could block the I/O thread
                except zmq.ZMQError:
                    pass
        ctx.destroy(linger=int(linger * 1000))


def verify(frames: List[Any]) -> Optional[Tuple[tuple, List[memoryview]]]:
    """Check a received ``[signature, header, *body]``; return ``(header, body)`` or None."""
    if len(frames) < 2:
        return None
    sig, head = frames[0].bytes if hasattr(frames[0], "bytes") else frames[0], frames[1]
    head_bytes = head.bytes if hasattr(head, "bytes") else bytes(head)
    body = [f.buffer if hasattr(f, "buffer") else memoryview(f) for f in frames[2:]]
    if len(sig) != _SIG_BYTES or not hmac.compare_digest(sig, _mac(head_bytes, body)):
        logger.warning("dropped a message that failed authentication (%d frames)", len(frames))
        return None
    return pickle.loads(head_bytes), body


def recv(sock: zmq.Socket, router: bool = False, flags: int = 0):
    """Receive one message; returns ``(header, body)`` (with identity first for a ROUTER),
    or ``None`` when it failed authentication and was dropped unread."""
    frames = sock.recv_multipart(flags=flags, copy=False)
    identity = None
    if router:
        identity, frames = frames[0].bytes, frames[1:]
    checked = verify(frames)
    if checked is None:
        return None
    return (identity, *checked) if router else checked


_monitor_ids = itertools.count()
_monitored: "weakref.WeakSet[zmq.Socket]" = weakref.WeakSet()


def monitor_socket(sock: zmq.Socket, events: int) -> zmq.Socket:
    """A PAIR socket receiving ``sock``'s connection events.

    ZeroMQ's I/O thread *blocks* (and with it every socket of the process) when it
    emits an event that its monitor cannot take: when the queue is full, or when
    the reading end was closed while ``sock`` lives on. So the queue here is
    unbounded, and a monitor must be closed with :func:`close_monitored`, which
    stops the events first.
    """
    address = f"inproc://fiberrl-monitor-{os.getpid()}-{next(_monitor_ids)}"
    sock.monitor(address, events)
    _monitored.add(sock)
    monitor = context().socket(zmq.PAIR)
    monitor.setsockopt(zmq.RCVHWM, 0)  # with RCVHWM 0 the inproc pipe has no limit
    monitor.connect(address)
    return monitor


def close_monitored(sock: zmq.Socket, monitor: Optional[zmq.Socket], linger: int) -> None:
    """Close a monitored socket and its monitor, stopping the events first."""
    if monitor is not None:
        try:
            sock.disable_monitor()
        except zmq.ZMQError:
            pass
        monitor.close(linger=0)
    sock.close(linger=linger)


class _MonitoredPair:
    """Closes a socket and its monitor in a safe order when the last reference goes
    (a thread-local's attributes are dropped in no particular order)."""

    def __init__(self, sock: zmq.Socket, monitor: zmq.Socket, linger: int) -> None:
        self.sock, self.monitor, self.linger = sock, monitor, linger

    def __del__(self) -> None:
        try:
            if not self.sock.closed:
                close_monitored(self.sock, self.monitor, self.linger)
        except Exception:
            pass


def monitor_event(monitor: zmq.Socket) -> int:
    """Read one event from a ZeroMQ monitor socket and return its event number.

    (``zmq.utils.monitor`` would do, but it imports asyncio: 50 ms of every job's start.)
    """
    frames = monitor.recv_multipart()
    return struct.unpack_from("=H", frames[0])[0]


def local_hostname() -> str:
    """This machine's short host name (used to prefer ipc:// between co-located peers)."""
    return _socket.gethostname()


def default_listen_host() -> str:
    """An address other machines can reach this one at (falls back to loopback)."""
    try:
        with _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM) as probe:
            probe.connect(("10.255.255.255", 1))
            return probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def bind_random(sock: zmq.Socket, host: str) -> str:
    """Bind ``sock`` to a free TCP port on ``host`` and return its address."""
    port = sock.bind_to_random_port(f"tcp://{host}", min_port=20000, max_port=65000,
                                    max_tries=200)
    return f"tcp://{host}:{port}"


def configure_peer_socket(sock: zmq.Socket) -> None:
    """Options for sockets that talk across hosts: heartbeats and bounded linger."""
    from .config import get_config
    cfg = get_config()
    sock.setsockopt(zmq.HEARTBEAT_IVL, int(cfg.heartbeat_interval * 1000))
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(cfg.heartbeat_timeout * 1000))
    sock.setsockopt(zmq.HEARTBEAT_TTL, int(cfg.heartbeat_timeout * 1000))
    sock.setsockopt(zmq.LINGER, 5000)


class HubUnreachable(ConnectionError):
    """The hub that owns an object (a queue, a pipe registry, a lock) cannot be reached."""


class RemoteCallError(Exception):
    """A hub service rejected a call; carries the exception it raised."""


_call_ids = itertools.count(1)
#: Calls carrying more than this go over ZeroMQ, which moves large frames without
#: copying them; small ones over the hub's stream door, which answers sooner. (A
#: thread's calls wait for their replies, so switching between the two keeps order.)
STREAM_CALL_MAX_BYTES = 1 << 20


def _body_bytes(body: Sequence[Any]) -> int:
    return sum(len(f) if isinstance(f, bytes) else memoryview(f).nbytes for f in body)


def pack_body(body: Sequence[Any]) -> tuple:
    """``(first, rest)``: the first frame as bytes (to be signed), the others as they are."""
    if not body:
        return None, []
    first = body[0] if isinstance(body[0], bytes) else bytes(body[0])
    return first, list(body[1:])


def unpack_body(first: Optional[bytes], rest: List[Any]) -> List[Any]:
    """The inverse of :func:`pack_body`: the message's body frames."""
    return rest if first is None else [memoryview(first), *rest]


def connect_door(door: dict, timeout: float) -> Any:
    """A :class:`~fiberrl.stream.StreamConnection` to a hub's door: its Unix socket
    from the same host, else TCP; None if neither can be reached."""
    from .stream import StreamConnection
    addresses = [door["tcp"]]
    if door.get("unix") and door.get("host") == local_hostname():
        addresses.insert(0, door["unix"])  # fails from another network namespace
    for address in addresses:
        try:
            return StreamConnection(address, timeout=timeout)
        except OSError as exc:
            logger.debug("no stream to hub door %s (%s)", address, exc)
    return None


class HubClient:
    """Request/reply client for one hub address, one connection per calling thread.

    The first call asks the hub (over ZeroMQ) where its stream door is
    (:mod:`fiberrl.hub_streams`); each thread then calls over a stream of its own,
    which costs a fraction of a ZeroMQ round trip. A hub without a door, or one the
    stream cannot reach, is called over a DEALER socket as before.

    Calls carry a request id; stale replies (from calls that timed out) are skipped.
    While waiting, the client watches its connection: a stream that ends, or a ZeroMQ
    connection that stays down for longer than ``grace`` seconds, raises
    :class:`HubUnreachable` instead of hanging.
    """

    def __init__(self, address: str, grace: float = 10.0) -> None:
        self.address = address
        self.grace = grace
        self._local = threading.local()
        self._pid = os.getpid()
        self._door_lock = threading.Lock()
        self._door: Optional[dict] = None
        self._door_known = False

    def know_door(self, door: dict) -> None:
        """Use ``door`` as the hub's stream door without asking (a job knows its
        parent's from its environment)."""
        with self._door_lock:
            self._door, self._door_known = door, True

    def _door_address(self) -> Optional[dict]:
        with self._door_lock:
            if not self._door_known:
                try:
                    (self._door,), _ = self._call_zmq("hub", "streams", (), (), self.grace)
                except LookupError:
                    self._door = None  # a hub without a door
                self._door_known = True
            return self._door

    def _stream(self) -> Any:
        """This thread's stream to the hub (opened on first use), or None."""
        local = self._local
        if getattr(local, "stream_pid", None) == os.getpid():
            return local.stream
        door = self._door_address()
        local.stream_pid = os.getpid()
        local.stream = None if door is None else connect_door(door, self.grace)
        return local.stream

    def _drop_stream(self) -> None:
        local = self._local
        if getattr(local, "stream", None) is not None:
            local.stream.close()
        local.stream_pid, local.stream = None, None

    def _lost(self) -> HubUnreachable:
        return HubUnreachable(f"lost contact with the fiberrl hub at {self.address} "
                              f"(its process has probably exited)")

    def _socket(self):
        local = self._local
        if getattr(local, "pid", None) != os.getpid():
            sock = context().socket(zmq.DEALER)
            configure_peer_socket(sock)
            sock.setsockopt(zmq.LINGER, 2000)
            monitor = monitor_socket(sock, zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
            sock.connect(self.address)
            local.sock, local.monitor, local.pid = sock, monitor, os.getpid()
            local.closer = _MonitoredPair(sock, monitor, 2000)
            local.connected, local.lost_since = False, time.monotonic()
        return local

    def _watch(self, local) -> None:
        while local.monitor.poll(0):
            event = monitor_event(local.monitor)
            if event == zmq.EVENT_CONNECTED:
                local.connected, local.lost_since = True, None
            elif event == zmq.EVENT_DISCONNECTED:
                local.connected, local.lost_since = False, time.monotonic()

    def cast(self, service: str, op: str, *args: Any, body: Sequence[Any] = ()) -> None:
        """Send a one-way message to a hub service."""
        conn = self._stream()
        if conn is None:
            send(self._socket().sock, (service, op, 0, *args), body)
            return
        first, rest = pack_body(body)
        try:
            conn.send((service, op, 0, args, first), rest)
        except OSError:
            self._drop_stream()
            raise self._lost() from None

    def call(self, service: str, op: str, *args: Any, body: Sequence[Any] = (),
             timeout: Optional[float] = None) -> Tuple[tuple, List[memoryview]]:
        """Call ``op`` of ``service`` and wait for its reply ``(values, body)``.

        Raises :class:`TimeoutError` after ``timeout`` seconds (``None``: wait while the
        hub is reachable) and :class:`HubUnreachable` if the hub goes away.
        """
        conn = None if _body_bytes(body) > STREAM_CALL_MAX_BYTES else self._stream()
        if conn is None:
            return self._call_zmq(service, op, args, body, timeout)
        return self._call_stream(conn, service, op, args, body, timeout)

    def _call_stream(self, conn: Any, service: str, op: str, args: tuple, body: Sequence[Any],
                     timeout: Optional[float]) -> Tuple[tuple, List[Any]]:
        req_id = next(_call_ids)
        first, rest = pack_body(body)
        try:
            conn.send((service, op, req_id, args, first), rest)
        except OSError:
            self._drop_stream()
            raise self._lost() from None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = 1.0 if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                got = conn.recv(wait)
            except EOFError:
                self._drop_stream()
                raise self._lost() from None
            if got is None:
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"no reply from hub {self.address} to {service}.{op}")
                continue
            header, buffers = got
            values = _answer(header, req_id)
            if values is not None:
                return values[:-1], unpack_body(values[-1], buffers)

    def _call_zmq(self, service: str, op: str, args: tuple, body: Sequence[Any],
                  timeout: Optional[float]) -> Tuple[tuple, List[memoryview]]:
        local = self._socket()
        req_id = next(_call_ids)
        send(local.sock, (service, op, req_id, *args), body)
        deadline = None if timeout is None else time.monotonic() + timeout
        poller = zmq.Poller()
        poller.register(local.sock, zmq.POLLIN)
        poller.register(local.monitor, zmq.POLLIN)
        while True:
            wait = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
            ready = dict(poller.poll(wait * 1000))
            if local.monitor in ready:
                self._watch(local)
            if local.sock in ready:
                got = recv(local.sock)
                if got is None:
                    continue
                header, reply_body = got
                values = _answer(header, req_id)
                if values is not None:
                    return values, reply_body
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"no reply from hub {self.address} to {service}.{op}")
            if local.lost_since is not None and time.monotonic() - local.lost_since > self.grace:
                raise self._lost()


def _answer(header: tuple, req_id: int) -> Optional[tuple]:
    """The values a reply ``header`` carries for call ``req_id`` (raising the error the
    hub sent back); None for a late reply to an abandoned call."""
    if header[0] != req_id:
        return None
    if header[1] == "err":
        raise header[2]
    return header[2:]


_clients_lock = threading.Lock()
_clients: dict = {}


def client_for(address: str) -> HubClient:
    """A shared :class:`HubClient` for ``address`` in this process."""
    with _clients_lock:
        key = (address, os.getpid())
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = HubClient(address)
        return client
