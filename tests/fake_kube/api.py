"""The fake core/v1 REST API: ``Request`` and ``Response``, the route table, and
``CoreV1Api``, which answers pods, secrets, configmaps, namespaces, the node and ``/version``
(including watches and logs) the way the real API server does. Part of the in-repo FAKE
Kubernetes core/v1 API used by tests (see ``fake_kube``); NOT a real cluster.
"""
from __future__ import annotations

import base64
import copy
import json
import os
import random
import re
import time
import uuid
from typing import (TYPE_CHECKING, Any, Callable, Dict, Iterator, List, NamedTuple, Optional,
                    Tuple)
from urllib.parse import unquote

from .objects import (ApiError, FieldErrors, KINDS, KUBE_VERSION, NODE_NAME, Requirement,
                      _GENERATE_CHARS, _now, _ts, bad_request, not_found, object_matches,
                      parse_field_selector, parse_label_selector)
from .store import (Event, _list_item, _validate_metadata, default_pod, merge_patch,
                    validate_config, validate_pod)
from .kubelet import PodRuntime

if TYPE_CHECKING:  # only for annotations; cluster imports this module
    from .cluster import FakeKubeCluster


# --------------------------------------------------------------------------------------
# HTTP: requests, responses and the core/v1 routes
# --------------------------------------------------------------------------------------
class Request(NamedTuple):
    """One HTTP request as the API sees it."""
    method: str
    path: str
    query: Dict[str, str]
    body: bytes
    content_type: str
    client_gone: Callable[[], bool]

    def json(self) -> Any:
        if not self.body:
            return None
        try:
            return json.loads(self.body)
        except ValueError as exc:
            raise bad_request(f"the body of the request was in an unknown format: {exc}") from None

    def flag(self, name: str) -> bool:
        return self.query.get(name, "").lower() in ("true", "1")

    def int_param(self, name: str) -> Optional[int]:
        value = self.query.get(name)
        if value in (None, ""):
            return None
        try:
            return int(value)
        except ValueError:
            raise bad_request(f"invalid value for {name}: {value!r}") from None


class Response(NamedTuple):
    """A JSON body, a text body or a chunked stream of bytes."""
    code: int
    body: Any = None
    content_type: str = "application/json"
    stream: Optional[Iterator[bytes]] = None


_ROUTES = [
    ("version", r"/version/?"),
    ("healthz", r"/(?:healthz|readyz|livez)/?"),
    ("namespaces", r"/api/v1/namespaces/?"),
    ("namespace", r"/api/v1/namespaces/(?P<ns>[^/]+)/?"),
    ("nodes", r"/api/v1/nodes/?"),
    ("node", r"/api/v1/nodes/(?P<name>[^/]+)/?"),
    ("all", r"/api/v1/(?P<plural>pods|secrets|configmaps)/?"),
    ("collection", r"/api/v1/namespaces/(?P<ns>[^/]+)/(?P<plural>pods|secrets|configmaps)/?"),
    ("item", r"/api/v1/namespaces/(?P<ns>[^/]+)/(?P<plural>pods|secrets|configmaps)"
             r"/(?P<name>[^/]+)/?"),
    ("log", r"/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)/log/?"),
    ("status", r"/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)/status/?"),
]
_ROUTES_RE = [(name, re.compile(f"^{pattern}$")) for name, pattern in _ROUTES]


def _method_not_allowed(method: str) -> ApiError:
    return ApiError(405, "MethodNotAllowed",
                    f"the server does not allow this method on the requested resource ({method})")


class CoreV1Api:
    """The core/v1 REST endpoints of the fake API server (runs in the HTTP threads)."""

    def __init__(self, cluster: "FakeKubeCluster") -> None:
        self.cluster = cluster
        self.store = cluster.store
        self.lock = cluster.cond

    def handle(self, req: Request) -> Response:
        """Route one request; raise :class:`ApiError` for error answers."""
        for route, pattern in _ROUTES_RE:
            match = pattern.match(req.path)
            if match:
                args = {k: unquote(v) for k, v in match.groupdict().items()}
                if "ns" in args:
                    self.cluster.namespaces.add(args["ns"])
                return getattr(self, f"_route_{route}")(req, **args)
        raise ApiError(404, "NotFound", "the server could not find the requested resource")

    # -- small endpoints ----------------------------------------------------------------
    def _route_version(self, req: Request) -> Response:
        return Response(200, KUBE_VERSION)

    def _route_healthz(self, req: Request) -> Response:
        return Response(200, "ok", "text/plain; charset=utf-8")

    def _route_namespaces(self, req: Request) -> Response:
        items = [_list_item(self._namespace(ns)) for ns in sorted(self.cluster.namespaces)]
        return Response(200, {"kind": "NamespaceList", "apiVersion": "v1",
                              "metadata": {"resourceVersion": str(self.store.rv)},
                              "items": items})

    def _route_namespace(self, req: Request, ns: str) -> Response:
        if req.method != "GET":
            raise _method_not_allowed(req.method)
        return Response(200, self._namespace(ns))

    def _namespace(self, ns: str) -> dict:
        return {"kind": "Namespace", "apiVersion": "v1",
                "metadata": {"name": ns, "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, ns)),
                             "resourceVersion": "1",
                             "creationTimestamp": _ts(self.cluster.started_at),
                             "labels": {"kubernetes.io/metadata.name": ns}},
                "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}

    def _route_nodes(self, req: Request) -> Response:
        return Response(200, {"kind": "NodeList", "apiVersion": "v1",
                              "metadata": {"resourceVersion": str(self.store.rv)},
                              "items": [_list_item(self.cluster.node())]})

    def _route_node(self, req: Request, name: str) -> Response:
        if name != NODE_NAME:
            raise not_found("nodes", name)
        return Response(200, self.cluster.node())

    # -- collections --------------------------------------------------------------------
    def _route_all(self, req: Request, plural: str) -> Response:
        if req.method != "GET":
            raise _method_not_allowed(req.method)
        return self._list(req, plural, None)

    def _route_collection(self, req: Request, ns: str, plural: str) -> Response:
        if req.method == "GET":
            return self._list(req, plural, ns)
        if req.method == "POST":
            return self._create(req, plural, ns)
        if req.method == "DELETE":
            return self._delete_collection(req, plural, ns)
        raise _method_not_allowed(req.method)

    def _list(self, req: Request, plural: str, ns: Optional[str]) -> Response:
        kind = KINDS[plural]
        labels = parse_label_selector(req.query.get("labelSelector", ""))
        fields = parse_field_selector(req.query.get("fieldSelector", ""), kind)
        if req.flag("watch"):
            return self._watch(req, kind, ns, labels, fields)
        with self.lock:
            items = [_list_item(o) for o in self.store.values(kind, ns)
                     if object_matches(o, labels, fields)]
            rv = self.store.rv
        return Response(200, {"kind": f"{kind}List", "apiVersion": "v1",
                              "metadata": {"resourceVersion": str(rv)}, "items": items})

    def _create(self, req: Request, plural: str, ns: str) -> Response:
        kind = KINDS[plural]
        body = req.json()
        if not isinstance(body, dict) or not isinstance(body.get("metadata", {}), dict):
            raise bad_request(f"the body of the request was not a {kind} object")
        if body.get("kind") not in (None, kind) or body.get("apiVersion") not in (None, "v1"):
            raise bad_request(f"the API version or kind in the data ({body.get('apiVersion')}, "
                              f"{body.get('kind')}) does not match the expected v1 {kind}")
        if body.get("metadata", {}).get("namespace") not in (None, "", ns):
            raise bad_request("the namespace of the provided object does not match the "
                              "namespace sent on the request")
        dry_run = bool(req.query.get("dryRun"))
        for _ in range(8):  # generateName: retry on a name collision
            obj, generated = self._new_object(kind, ns, body)
            with self.lock:
                if self.store.get(kind, ns, obj["metadata"]["name"]) is None:
                    if dry_run:
                        return Response(201, obj)
                    return Response(201, self.cluster.add_object(obj))
                if not generated:
                    break
        name = obj["metadata"]["name"]
        raise ApiError(409, "AlreadyExists", f'{plural} "{name}" already exists',
                       {"name": name, "kind": plural})

    def _new_object(self, kind: str, ns: str, body: dict) -> Tuple[dict, bool]:
        """A validated, defaulted copy of ``body`` with the server-set metadata."""
        obj = copy.deepcopy(body)
        obj["kind"], obj["apiVersion"] = kind, "v1"
        meta = obj.setdefault("metadata", {})
        generated = not meta.get("name") and bool(meta.get("generateName"))
        if generated:
            suffix = "".join(random.choice(_GENERATE_CHARS) for _ in range(5))
            meta["name"] = meta["generateName"] + suffix
        for key in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds",
                    "selfLink", "managedFields"):
            meta.pop(key, None)
        meta.update(namespace=ns, uid=str(uuid.uuid4()), creationTimestamp=_now())
        if kind == "Pod":
            obj.pop("status", None)
            validate_pod(obj, generated)
            default_pod(obj)
        else:
            if kind == "Secret":
                self._fold_string_data(obj)
            validate_config(obj, generated)
        return obj, generated

    @staticmethod
    def _fold_string_data(secret: dict) -> None:
        """Like the API server: ``stringData`` is write-only, merged into base64 ``data``."""
        secret.setdefault("type", "Opaque")
        string_data = secret.pop("stringData", None) or {}
        if string_data:
            data = secret.setdefault("data", {}) or {}
            for key, value in string_data.items():
                data[key] = base64.b64encode(str(value).encode()).decode()
            secret["data"] = data

    def _delete_collection(self, req: Request, plural: str, ns: str) -> Response:
        kind = KINDS[plural]
        labels = parse_label_selector(req.query.get("labelSelector", ""))
        fields = parse_field_selector(req.query.get("fieldSelector", ""), kind)
        grace, propagation, _ = self._delete_options(req)
        with self.lock:
            targets = [o for o in self.store.values(kind, ns) if object_matches(o, labels, fields)]
            deleted = [] if req.query.get("dryRun") else [
                self.cluster.delete_object(kind, ns, o["metadata"]["name"], grace, propagation)
                for o in targets]
            rv = self.store.rv
        items = [_list_item(o) for o in (deleted or targets) if o is not None]
        return Response(200, {"kind": f"{kind}List", "apiVersion": "v1",
                              "metadata": {"resourceVersion": str(rv)}, "items": items})

    # -- single objects -----------------------------------------------------------------
    def _route_item(self, req: Request, ns: str, plural: str, name: str) -> Response:
        if req.method == "GET":
            return Response(200, self._get(plural, ns, name))
        if req.method == "DELETE":
            return self._delete(req, plural, ns, name)
        if req.method == "PATCH":
            return self._patch(req, plural, ns, name)
        raise _method_not_allowed(req.method)

    def _route_status(self, req: Request, ns: str, name: str) -> Response:
        if req.method != "GET":
            raise _method_not_allowed(req.method)
        return Response(200, self._get("pods", ns, name))

    def _get(self, plural: str, ns: str, name: str) -> dict:
        obj = self.store.get(KINDS[plural], ns, name)
        if obj is None:
            raise not_found(plural, name)
        return obj

    def _delete_options(self, req: Request) -> Tuple[Optional[int], str, dict]:
        """gracePeriodSeconds, propagationPolicy and preconditions (query wins over body)."""
        body = req.json() or {}
        if not isinstance(body, dict):
            raise bad_request("the body of a delete request must be a DeleteOptions object")
        grace = req.int_param("gracePeriodSeconds")
        if grace is None:
            grace = body.get("gracePeriodSeconds")
        if grace is not None and (not isinstance(grace, int) or grace < 0):
            raise bad_request(f"invalid gracePeriodSeconds {grace!r}")
        propagation = req.query.get("propagationPolicy") or body.get("propagationPolicy")
        orphan = req.query.get("orphanDependents", "").lower() == "true" or \
            body.get("orphanDependents") is True
        propagation = propagation or ("Orphan" if orphan else "Background")
        if propagation not in ("Orphan", "Background", "Foreground"):
            raise bad_request(f"invalid propagationPolicy {propagation!r}")
        return grace, propagation, body.get("preconditions") or {}

    def _delete(self, req: Request, plural: str, ns: str, name: str) -> Response:
        kind = KINDS[plural]
        grace, propagation, preconditions = self._delete_options(req)
        with self.lock:
            obj = self._get(plural, ns, name)
            meta = obj["metadata"]
            for key in ("uid", "resourceVersion"):
                wanted = preconditions.get(key)
                if wanted and wanted != meta[key]:
                    raise ApiError(409, "Conflict", (
                        f"Operation cannot be fulfilled on {plural} \"{name}\": Precondition "
                        f"failed: {key.upper() if key == 'uid' else key} in precondition: "
                        f"{wanted}, {key} in object meta: {meta[key]}"),
                        {"name": name, "kind": plural})
            if not req.query.get("dryRun"):
                obj = self.cluster.delete_object(kind, ns, name, grace, propagation) or obj
        if kind == "Pod":
            return Response(200, obj)
        return Response(200, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                              "status": "Success",
                              "details": {"name": name, "kind": plural, "uid": meta["uid"]}})

    def _patch(self, req: Request, plural: str, ns: str, name: str) -> Response:
        kind = KINDS[plural]
        if "json-patch" in req.content_type or "apply-patch" in req.content_type:
            raise ApiError(415, "UnsupportedMediaType",
                           f"the fake API server only supports merge patches, not "
                           f"{req.content_type}")
        patch = req.json()
        if not isinstance(patch, dict):
            raise bad_request("a merge patch must be a JSON object")
        with self.lock:
            obj = self._get(plural, ns, name)
            new = merge_patch(copy.deepcopy(obj), patch)
            for key in ("name", "namespace", "uid", "creationTimestamp", "resourceVersion",
                        "deletionTimestamp", "deletionGracePeriodSeconds"):
                new["metadata"].pop(key, None)
                if key in obj["metadata"]:
                    new["metadata"][key] = obj["metadata"][key]
            new["kind"], new["apiVersion"] = kind, "v1"
            errs = FieldErrors()
            _validate_metadata(new["metadata"], errs, False)
            if kind == "Pod":
                new["status"] = obj["status"]
                if new.get("spec") != obj["spec"]:
                    errs.forbidden("spec", "pod updates may not change fields other than "
                                   "`spec.containers[*].image`, `spec.activeDeadlineSeconds` "
                                   "or `spec.tolerations` (the fake allows none of them)")
            errs.raise_if_any(kind, name)
            return Response(200, self.store.replace(new))

    # -- logs ---------------------------------------------------------------------------
    def _route_log(self, req: Request, ns: str, name: str) -> Response:
        if req.method != "GET":
            raise _method_not_allowed(req.method)
        pod = self._get("pods", ns, name)
        container = pod["spec"]["containers"][0]["name"]
        asked = req.query.get("container") or container
        if asked != container:
            names = [c["name"] for c in pod["spec"]["containers"]]
            raise bad_request(f"container {asked} is not valid for pod {name}"
                              if asked not in names else
                              f"fake kubelet runs only the first container ({container})")
        rt = self.cluster.kubelet.runtime(pod["metadata"]["uid"])
        previous = req.flag("previous")
        attempt = (rt.attempts - 1 if previous else rt.attempts) if rt is not None else 0
        if attempt < 1 or not os.path.exists(rt.log_path(attempt)):
            raise bad_request(self._no_log_message(pod, container, previous))
        path = rt.log_path(attempt)
        tail = req.int_param("tailLines")
        limit = req.int_param("limitBytes")
        if req.flag("follow") and not previous:
            return Response(200, content_type="text/plain",
                            stream=self._follow(req, rt, attempt, path, tail))
        text = _tail(_read_text(path), tail)
        if limit is not None:
            text = text.encode()[:limit].decode("utf-8", "replace")
        return Response(200, text, "text/plain")

    @staticmethod
    def _no_log_message(pod: dict, container: str, previous: bool) -> str:
        name = pod["metadata"]["name"]
        if previous:
            return f'previous terminated container "{container}" in pod "{name}" not found'
        statuses = pod["status"].get("containerStatuses") or [{}]
        waiting = (statuses[0].get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason", "ContainerCreating")
        if reason in ("ErrImagePull", "ImagePullBackOff"):
            return f'container "{container}" in pod "{name}" is waiting to start: ' \
                   'trying and failing to pull image'
        return f'container "{container}" in pod "{name}" is waiting to start: {reason}'

    def _follow(self, req: Request, rt: PodRuntime, attempt: int, path: str,
                tail: Optional[int]) -> Iterator[bytes]:
        """The log so far, then what the process writes, until it ends or the client goes."""
        with open(path, "rb") as log:
            head = log.read()
            yield _tail(head.decode("utf-8", "replace"), tail).encode()
            while True:
                running = rt.finished_attempts < attempt
                chunk = log.read()
                if chunk:
                    yield chunk
                elif not running or self.cluster.stopping or req.client_gone():
                    return
                else:
                    time.sleep(0.1)

    # -- watch --------------------------------------------------------------------------
    def _watch(self, req: Request, kind: str, ns: Optional[str], labels: List[Requirement],
               fields: List[Tuple[str, str, str]]) -> Response:
        timeout = req.int_param("timeoutSeconds")
        timeout = 1800 if timeout is None or timeout <= 0 else timeout
        rv_text = req.query.get("resourceVersion", "")
        if rv_text not in ("", "0") and not rv_text.isdigit():
            raise bad_request(f'invalid resource version "{rv_text}"')
        with self.lock:
            if rv_text in ("", "0"):
                initial = [Event(int(o["metadata"]["resourceVersion"]), "ADDED", o, None)
                           for o in self.store.values(kind, ns)]
                cursor = self.store.rv
            else:
                initial, cursor = [], int(rv_text)
        stream = self._watch_stream(req, kind, ns, labels, fields, initial, cursor,
                                    time.monotonic() + timeout)
        return Response(200, content_type="application/json", stream=stream)

    def _watch_stream(self, req: Request, kind: str, ns: Optional[str],
                      labels: List[Requirement], fields: List[Tuple[str, str, str]],
                      initial: List[Event], cursor: int, deadline: float) -> Iterator[bytes]:
        def lines(events: List[Event]) -> bytes:
            out = []
            for event in events:
                shown = _watch_view(event, kind, ns, labels, fields)
                if shown is not None:
                    out.append(json.dumps({"type": shown[0], "object": shown[1]}) + "\n")
            return "".join(out).encode()

        yield lines(initial)
        while True:
            with self.lock:
                events = self.store.events_after(cursor)
                if events == [] and not self.cluster.stopping:
                    self.lock.wait(min(1.0, max(0.0, deadline - time.monotonic())))
                    events = self.store.events_after(cursor)
            if events is None:
                yield (json.dumps({"type": "ERROR", "object": ApiError(
                    410, "Expired", f"too old resource version: {cursor} "
                    f"({self.store.compacted_rv})").status()}) + "\n").encode()
                return
            if events:
                cursor = events[-1].rv
                yield lines(events)
            if self.cluster.stopping or time.monotonic() >= deadline or req.client_gone():
                return


def _watch_view(event: Event, kind: str, ns: Optional[str], labels: List[Requirement],
                fields: List[Tuple[str, str, str]]) -> Optional[Tuple[str, dict]]:
    """How a filtered watch shows an event: an object that stops (starts) matching the
    selectors is DELETED (ADDED) for that watcher, as in Kubernetes."""
    obj = event.obj
    if obj["kind"] != kind or ns not in (None, obj["metadata"]["namespace"]):
        return None
    now = object_matches(obj, labels, fields)
    before = event.prev is not None and object_matches(event.prev, labels, fields)
    if event.type == "MODIFIED":
        if now and before:
            return "MODIFIED", obj
        if now:
            return "ADDED", obj
        return ("DELETED", obj) if before else None
    if event.type == "DELETED":
        return ("DELETED", obj) if before or now else None
    return ("ADDED", obj) if now else None


def _read_text(path: str) -> str:
    with open(path, "rb") as log:
        return log.read().decode("utf-8", "replace")


def _tail(text: str, lines: Optional[int]) -> str:
    if lines is None or lines < 0:
        return text
    if lines == 0:
        return ""
    return "".join(text.splitlines(keepends=True)[-lines:])
