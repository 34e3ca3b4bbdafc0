"""FakeKubeCluster: an in-repo fake of the Kubernetes core/v1 API for tests; NOT a real cluster.

No kube-apiserver, kubelet, k3s or kind can run on the project's machines (see
/work/shared/INFRA.md), so the Kubernetes backend is tested against this fake, driven by the
official ``kubernetes`` Python client exactly as a real cluster would be:

- an HTTP server (plain HTTP on 127.0.0.1, bearer-token auth) that serves the part of the
  core/v1 REST API a job backend uses -- pods (create, get, list, watch, delete, delete
  collection, merge patch, log, status), secrets, configmaps, namespaces, the node and
  ``/version`` -- with the JSON shapes, ``Status`` errors, resourceVersions and watch events of
  the real API server;
- a scheduler that binds each pod onto the single node ``fake-node`` when its resource requests
  fit, or leaves it ``Pending`` with ``PodScheduled=False, reason=Unschedulable``;
- a fake kubelet (``kubelet="process"``) that really runs ``containers[0]``'s command as a local
  process (in its own session, with only the environment the pod spec gives it), captures its
  output as the container log, enforces the memory limit by polling RSS, honours deletion grace
  periods, ``activeDeadlineSeconds`` and ``restartPolicy``, and reports phases and container
  states as a kubelet does;
- the owner-reference garbage collector (background propagation).

Typical use::

    with FakeKubeCluster(node_cpu=4, node_memory="8Gi") as cluster:
        v1 = kubernetes.client.CoreV1Api(cluster.api_client())
        # or: kubernetes.config.load_kube_config(config_file=cluster.kubeconfig_path)

Everything here is a test double: behaviour that is not listed above (TLS, RBAC, admission,
init containers, volumes, probes, ...) is missing, see tests/FAKE_KUBE_README.md.
"""
from __future__ import annotations

import base64
import binascii
import bisect
import copy
import hashlib
import json
import logging
import math
import os
import random
import re
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from decimal import Decimal, InvalidOperation
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Set, Tuple
from urllib.parse import parse_qs, unquote, urlsplit

import psutil

logger = logging.getLogger(__name__)

NODE_NAME = "fake-node"
NODE_LABELS = {"kubernetes.io/hostname": NODE_NAME, "kubernetes.io/os": "linux",
               "kubernetes.io/arch": "amd64"}
POD_IP = "127.0.0.1"
HOST_IP = "127.0.0.1"
KUBE_VERSION = {
    "major": "1", "minor": "31", "gitVersion": "v1.31.0-fake", "gitCommit": "0" * 40,
    "gitTreeState": "clean", "buildDate": "2024-08-13T00:00:00Z", "goVersion": "go1.22.5",
    "compiler": "gc", "platform": "linux/amd64",
}
KINDS = {"pods": "Pod", "secrets": "Secret", "configmaps": "ConfigMap"}
PLURALS = {kind: plural for plural, kind in KINDS.items()}
BASE_ENV_VARS = ("PATH", "HOME", "LANG")
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
GPU = "nvidia.com/gpu"
_GENERATE_CHARS = "bcdfghjklmnpqrstvwxz2456789"
_UNSCHEDULABLE_TAIL = (". preemption: 0/1 nodes are available: "
                       "1 No preemption victims found for incoming pod.")


def _now() -> str:
    """The current time as Kubernetes writes timestamps (RFC 3339, seconds, UTC)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _ts(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


# --------------------------------------------------------------------------------------
# Errors: every failure is answered with a core/v1 Status object, as the API server does.
# --------------------------------------------------------------------------------------
class ApiError(Exception):
    """An error the fake API server answers with a ``Status`` object and an HTTP code."""

    def __init__(self, code: int, reason: str, message: str,
                 details: Optional[dict] = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> dict:
        """The ``Status`` object of this error."""
        out = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": self.message, "reason": self.reason, "code": self.code}
        if self.details:
            out["details"] = self.details
        return out


def not_found(plural: str, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{plural} "{name}" not found',
                    {"name": name, "kind": plural})


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


class FieldErrors:
    """Validation errors of one object, raised together as a 422 ``Invalid`` Status."""

    def __init__(self) -> None:
        self.causes: List[dict] = []

    def add(self, reason: str, field: str, message: str) -> None:
        self.causes.append({"reason": reason, "message": message, "field": field})

    def required(self, field: str, detail: str = "") -> None:
        self.add("FieldValueRequired", field,
                 "Required value" + (f": {detail}" if detail else ""))

    def invalid(self, field: str, value: Any, detail: str) -> None:
        self.add("FieldValueInvalid", field, f"Invalid value: {json.dumps(value)}: {detail}")

    def not_supported(self, field: str, value: Any, supported: List[str]) -> None:
        choices = ", ".join(f'"{s}"' for s in supported)
        self.add("FieldValueNotSupported", field,
                 f"Unsupported value: {json.dumps(value)}: supported values: {choices}")

    def duplicate(self, field: str, value: Any) -> None:
        self.add("FieldValueDuplicate", field, f"Duplicate value: {json.dumps(value)}")

    def forbidden(self, field: str, detail: str) -> None:
        self.add("FieldValueForbidden", field, f"Forbidden: {detail}")

    def raise_if_any(self, kind: str, name: str) -> None:
        """Raise the 422 ``Invalid`` error when any error was recorded."""
        if not self.causes:
            return
        texts = [f"{c['field']}: {c['message']}" for c in self.causes]
        text = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
        raise ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {text}',
                       {"name": name, "kind": kind, "causes": self.causes})


# --------------------------------------------------------------------------------------
# Quantities, names and selectors
# --------------------------------------------------------------------------------------
_QUANTITY_RE = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
                          r"(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$")
_SUFFIXES = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50,
             "Ei": 2 ** 60, "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
             "k": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9, "T": 10 ** 12, "P": 10 ** 15,
             "E": 10 ** 18}


def parse_quantity(value: Any) -> Decimal:
    """A Kubernetes resource quantity ("500m", "1.5", "100Mi", "1e3", 2) as a Decimal."""
    if isinstance(value, bool):
        raise ValueError(f"invalid quantity {value!r}")
    if isinstance(value, (int, float)):
        return Decimal(str(value))
    match = _QUANTITY_RE.match(str(value))
    if not match:
        raise ValueError("quantities must match the regular expression "
                         "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")
    number, exponent, suffix = match.groups()
    if exponent:
        return Decimal(number + exponent)
    return Decimal(number) * Decimal(_SUFFIXES[suffix]) if suffix else Decimal(number)


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_SUBDOMAIN_HELP = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                   "characters, '-' or '.', and must start and end with an alphanumeric "
                   "character")
_LABEL_HELP = ("a valid label must be an empty string or consist of alphanumeric characters, "
               "'-', '_' or '.', and must start and end with an alphanumeric character")


def dns_subdomain_error(name: str) -> Optional[str]:
    """Why ``name`` is not a valid object name (DNS-1123 subdomain), or None."""
    if len(name) > 253:
        return "must be no more than 253 characters"
    return None if _DNS_SUBDOMAIN.match(name) else _SUBDOMAIN_HELP


def _dns_label_error(name: str) -> Optional[str]:
    if len(name) > 63:
        return "must be no more than 63 characters"
    if _DNS_LABEL.match(name):
        return None
    return ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or "
            "'-', and must start and end with an alphanumeric character")


def _label_key_error(key: str) -> Optional[str]:
    prefix, _, name = key.rpartition("/")
    if prefix and dns_subdomain_error(prefix):
        return "prefix part " + dns_subdomain_error(prefix)
    if not name or len(name) > 63 or not _LABEL_NAME.match(name):
        return ("name part must consist of alphanumeric characters, '-', '_' or '.', and must "
                "start and end with an alphanumeric character (at most 63 characters)")
    return None


def _label_value_error(value: Any) -> Optional[str]:
    if not isinstance(value, str):
        return "must be a string"
    if len(value) > 63:
        return "must be no more than 63 characters"
    return None if _LABEL_VALUE.match(value) else _LABEL_HELP


class Requirement(NamedTuple):
    """One term of a label selector: ``key op values``."""
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: Tuple[str, ...]

    def matches(self, labels: Dict[str, str]) -> bool:
        """Whether ``labels`` satisfy this term (Kubernetes semantics)."""
        present = self.key in labels
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and labels[self.key] in self.values
        return not present or labels[self.key] not in self.values  # "!=", "notin"


_SEL_KEY = r"([A-Za-z0-9][-A-Za-z0-9_./]*)"
_SEL_SET = re.compile(rf"^{_SEL_KEY}\s+(in|notin)\s*\(([^)]*)\)$")
_SEL_EQ = re.compile(rf"^{_SEL_KEY}\s*(==|=|!=)\s*([-A-Za-z0-9_.]*)$")
_SEL_NOT = re.compile(rf"^!\s*{_SEL_KEY}$")
_SEL_EXISTS = re.compile(rf"^{_SEL_KEY}$")


def _split_terms(text: str) -> List[str]:
    """Split a selector on the commas that are not inside parentheses."""
    terms, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    return [t.strip() for t in terms if t.strip()]


def parse_label_selector(text: str) -> List[Requirement]:
    """Parse ``a=b,c!=d,e in (x,y),!f,g`` into requirements; 400 BadRequest when malformed."""
    out = []
    for term in _split_terms(text or ""):
        if m := _SEL_SET.match(term):
            values = tuple(v.strip() for v in m.group(3).split(",") if v.strip())
            out.append(Requirement(m.group(1), m.group(2), values))
        elif m := _SEL_EQ.match(term):
            op = "=" if m.group(2) in ("=", "==") else "!="
            out.append(Requirement(m.group(1), op, (m.group(3),)))
        elif m := _SEL_NOT.match(term):
            out.append(Requirement(m.group(1), "!", ()))
        elif m := _SEL_EXISTS.match(term):
            out.append(Requirement(m.group(1), "exists", ()))
        else:
            raise bad_request(f"unable to parse requirement: found '{term}', "
                              "expected: label selector term")
    return out


_FIELD_PATHS = {
    "Pod": ("metadata.name", "metadata.namespace", "spec.nodeName", "spec.restartPolicy",
            "spec.schedulerName", "spec.serviceAccountName", "status.phase", "status.podIP",
            "status.nominatedNodeName"),
    "Secret": ("metadata.name", "metadata.namespace", "type"),
    "ConfigMap": ("metadata.name", "metadata.namespace"),
}


def parse_field_selector(text: str, kind: str) -> List[Tuple[str, str, str]]:
    """Parse ``metadata.name=x,status.phase!=Failed`` into (path, op, value) triples."""
    out = []
    for term in _split_terms(text or ""):
        match = re.match(r"^([A-Za-z.]+)\s*(==|=|!=)\s*(.*)$", term)
        if not match:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{term}'")
        path, op, value = match.groups()
        if path not in _FIELD_PATHS[kind]:
            raise bad_request(f'field label not supported: {path}')
        out.append((path, "!=" if op == "!=" else "=", value))
    return out


def _field_value(obj: dict, path: str) -> str:
    node: Any = obj
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return "" if node is None else str(node)


def object_matches(obj: dict, labels: List[Requirement],
                   fields: List[Tuple[str, str, str]]) -> bool:
    """Whether ``obj`` is selected by the label and field selectors."""
    obj_labels = obj["metadata"].get("labels") or {}
    if not all(req.matches(obj_labels) for req in labels):
        return False
    return all((_field_value(obj, path) == value) == (op == "=") for path, op, value in fields)


# --------------------------------------------------------------------------------------
# Object store: objects, the resourceVersion counter and the watch history
# --------------------------------------------------------------------------------------
class Event(NamedTuple):
    """One change in the store, as replayed to watchers."""
    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    obj: dict
    prev: Optional[dict]


class Store:
    """Objects by (kind, namespace, name), like etcd behind the API server.

    Stored dicts are never mutated: every change stores a new copy with the next
    resourceVersion and appends an :class:`Event`. All methods take the cluster's lock.
    """

    def __init__(self, cond: threading.Condition, max_events: int = 10000) -> None:
        self.cond = cond
        self.max_events = max_events
        self.rv = 1
        self.compacted_rv = 0
        self.objects: Dict[Tuple[str, str, str], dict] = {}
        self.events: List[Event] = []
        self._event_rvs: List[int] = []

    def get(self, kind: str, ns: str, name: str) -> Optional[dict]:
        with self.cond:
            return self.objects.get((kind, ns, name))

    def values(self, kind: str, ns: Optional[str] = None) -> List[dict]:
        """Objects of ``kind`` (in ``ns``, or all namespaces), ordered by namespace and name."""
        with self.cond:
            keys = sorted(k for k in self.objects if k[0] == kind and ns in (None, k[1]))
            return [self.objects[k] for k in keys]

    def add(self, obj: dict) -> dict:
        with self.cond:
            obj = self._stamp(obj)
            self.objects[self._key(obj)] = obj
            self._emit("ADDED", obj, None)
            return obj

    def replace(self, obj: dict) -> dict:
        """Store a new version of an existing object (MODIFIED), unless nothing changed."""
        with self.cond:
            key = self._key(obj)
            prev = self.objects[key]
            if obj == prev:
                return prev
            obj = self._stamp(obj)
            self.objects[key] = obj
            self._emit("MODIFIED", obj, prev)
            return obj

    def remove(self, kind: str, ns: str, name: str) -> Optional[dict]:
        with self.cond:
            prev = self.objects.pop((kind, ns, name), None)
            if prev is None:
                return None
            obj = self._stamp(prev)
            self._emit("DELETED", obj, prev)
            return obj

    def events_after(self, rv: int) -> Optional[List[Event]]:
        """Events newer than ``rv``; None when ``rv`` is older than the kept history."""
        with self.cond:
            if rv < self.compacted_rv:
                return None
            return self.events[bisect.bisect_right(self._event_rvs, rv):]

    def compact(self) -> None:
        """Forget the whole history: older resourceVersions now answer 410 Expired."""
        with self.cond:
            self.events.clear()
            self._event_rvs.clear()
            self.compacted_rv = self.rv

    def _stamp(self, obj: dict) -> dict:
        obj = copy.deepcopy(obj)
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        return obj

    def _emit(self, kind: str, obj: dict, prev: Optional[dict]) -> None:
        self.events.append(Event(self.rv, kind, obj, prev))
        self._event_rvs.append(self.rv)
        if len(self.events) > self.max_events:
            half = len(self.events) // 2
            self.compacted_rv = self._event_rvs[half - 1]
            del self.events[:half], self._event_rvs[:half]
        self.cond.notify_all()

    @staticmethod
    def _key(obj: dict) -> Tuple[str, str, str]:
        meta = obj["metadata"]
        return obj["kind"], meta["namespace"], meta["name"]


def _list_item(obj: dict) -> dict:
    """An object as a list returns it: real lists leave out each item's kind and apiVersion."""
    return {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}


# --------------------------------------------------------------------------------------
# Validation and defaulting (what the API server checks and fills in on create)
# --------------------------------------------------------------------------------------
def _validate_metadata(meta: dict, errs: FieldErrors, from_generate: bool) -> None:
    name = meta.get("name") or ""
    field = "metadata.generateName" if from_generate else "metadata.name"
    if not name:
        errs.required("metadata.name", "name or generateName is required")
    elif error := dns_subdomain_error(name):
        errs.invalid(field, name, error)
    for key, value in (meta.get("labels") or {}).items():
        if error := _label_key_error(key):
            errs.invalid("metadata.labels", key, error)
        if error := _label_value_error(value):
            errs.invalid("metadata.labels", value, error)
    annotations = meta.get("annotations") or {}
    for key in annotations:
        if error := _label_key_error(key):
            errs.invalid("metadata.annotations", key, error)
    if sum(len(k) + len(str(v)) for k, v in annotations.items()) > 256 * 1024:
        errs.add("FieldValueTooLong", "metadata.annotations",
                 "Too long: must have at most 262144 bytes")
    _validate_owner_references(meta.get("ownerReferences") or [], errs)


def _validate_owner_references(refs: list, errs: FieldErrors) -> None:
    controllers = 0
    for i, ref in enumerate(refs):
        for key in ("apiVersion", "kind", "name", "uid"):
            if not ref.get(key):
                errs.required(f"metadata.ownerReferences[{i}].{key}")
        controllers += bool(ref.get("controller"))
    if controllers > 1:
        errs.invalid("metadata.ownerReferences", refs,
                     "Only one reference can have Controller set to true")


_FIELD_REFS = ("metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName",
               "spec.serviceAccountName", "status.hostIP", "status.hostIPs", "status.podIP",
               "status.podIPs")


def _validate_env(env: list, path: str, errs: FieldErrors) -> None:
    for i, var in enumerate(env):
        field = f"{path}.env[{i}]"
        name = var.get("name")
        if not name:
            errs.required(f"{field}.name")
        elif not _ENV_NAME.match(name):
            errs.invalid(f"{field}.name", name, "a valid environment variable name must "
                         "consist of alphabetic characters, digits, '_', '-', or '.', and "
                         "must not start with a digit")
        source = var.get("valueFrom")
        if source and var.get("value"):
            errs.invalid(f"{field}.valueFrom", "",
                         "may not be specified when `value` is not empty")
        if source:
            _validate_env_source(source, f"{field}.valueFrom", errs)


def _validate_env_source(source: dict, field: str, errs: FieldErrors) -> None:
    kinds = [k for k in ("secretKeyRef", "configMapKeyRef", "fieldRef", "resourceFieldRef")
             if source.get(k)]
    if len(kinds) != 1:
        errs.invalid(field, "", "must specify exactly one of: `fieldRef`, `resourceFieldRef`, "
                     "`configMapKeyRef` or `secretKeyRef`")
        return
    ref = source[kinds[0]]
    if kinds[0] in ("secretKeyRef", "configMapKeyRef"):
        for key in ("name", "key"):
            if not ref.get(key):
                errs.required(f"{field}.{kinds[0]}.{key}")
    elif kinds[0] == "fieldRef":
        path = ref.get("fieldPath", "")
        if path not in _FIELD_REFS and not re.match(r"^metadata\.(labels|annotations)\['.+'\]$",
                                                    path):
            errs.not_supported(f"{field}.fieldRef.fieldPath", path, list(_FIELD_REFS))


def _validate_resources(resources: dict, path: str, errs: FieldErrors) -> None:
    parsed: Dict[str, Dict[str, Decimal]] = {}
    for part in ("limits", "requests"):
        parsed[part] = {}
        for name, value in (resources.get(part) or {}).items():
            try:
                parsed[part][name] = parse_quantity(value)
            except (ValueError, InvalidOperation) as exc:
                raise bad_request(f"quantities must match the regular expression: "
                                  f"{path}.resources.{part}[{name}]: {exc}") from None
    limits, requests = parsed["limits"], parsed["requests"]
    for name, request in requests.items():
        limit = limits.get(name)
        if "/" in name and not name.startswith("kubernetes.io/"):  # extended resources
            if limit is None:
                errs.required(f"{path}.resources.limits",
                              "Limit must be set for non overcommitable resources")
            elif limit != request:
                errs.invalid(f"{path}.resources.requests[{name}]", str(request),
                             f"must be equal to {name} limit of {limit}")
        elif limit is not None and request > limit:
            errs.invalid(f"{path}.resources.requests", str(request),
                         f"must be less than or equal to {name} limit of {limit}")


def _validate_container(container: dict, path: str, names: Set[str],
                        errs: FieldErrors) -> None:
    name = container.get("name")
    if not name:
        errs.required(f"{path}.name")
    elif error := _dns_label_error(name):
        errs.invalid(f"{path}.name", name, error)
    elif name in names:
        errs.duplicate(f"{path}.name", name)
    names.add(name or "")
    if not container.get("image"):
        errs.required(f"{path}.image")
    for key in ("command", "args"):
        value = container.get(key)
        if value is not None and not (isinstance(value, list)
                                      and all(isinstance(v, str) for v in value)):
            raise bad_request(f"json: cannot unmarshal {path}.{key} into []string")
    _validate_env(container.get("env") or [], path, errs)
    _validate_resources(container.get("resources") or {}, path, errs)


def validate_pod(pod: dict, from_generate: bool) -> None:
    """Raise 422 Invalid (or 400) for a pod the real API server would reject."""
    errs = FieldErrors()
    _validate_metadata(pod["metadata"], errs, from_generate)
    spec = pod.get("spec") or {}
    if not isinstance(spec, dict):
        raise bad_request("json: cannot unmarshal spec into Go struct field Pod.spec")
    containers = spec.get("containers") or []
    for field in ("containers", "initContainers"):
        entries = spec.get(field) or []
        if not isinstance(entries, list) or not all(isinstance(c, dict) for c in entries):
            raise bad_request(f"json: cannot unmarshal spec.{field} into []Container")
    if not containers:
        errs.required("spec.containers")
    names: Set[str] = set()
    for i, container in enumerate(containers):
        _validate_container(container, f"spec.containers[{i}]", names, errs)
    for i, container in enumerate(spec.get("initContainers") or []):
        _validate_container(container, f"spec.initContainers[{i}]", names, errs)
    policy = spec.get("restartPolicy", "Always")
    if policy not in ("Always", "OnFailure", "Never"):
        errs.not_supported("spec.restartPolicy", policy, ["Always", "OnFailure", "Never"])
    grace = spec.get("terminationGracePeriodSeconds")
    if grace is not None and (not isinstance(grace, int) or grace < 0):
        errs.invalid("spec.terminationGracePeriodSeconds", grace,
                     "must be greater than or equal to 0")
    deadline = spec.get("activeDeadlineSeconds")
    if deadline is not None and (not isinstance(deadline, int) or deadline <= 0):
        errs.invalid("spec.activeDeadlineSeconds", deadline, "must be between 1 and 2147483647")
    errs.raise_if_any("Pod", pod["metadata"].get("name", ""))


def validate_config(obj: dict, from_generate: bool) -> None:
    """Raise 422 Invalid (or 400 for bad base64) for a Secret or ConfigMap."""
    errs = FieldErrors()
    _validate_metadata(obj["metadata"], errs, from_generate)
    size = 0
    for field in ("data", "binaryData"):
        for key, value in (obj.get(field) or {}).items():
            if not _CONFIG_KEY.match(key) or len(key) > 253:
                errs.invalid(f"{field}[{key}]", key, "a valid config key must consist of "
                             "alphanumeric characters, '-', '_' or '.'")
            size += len(_decode_value(obj["kind"], field, value))
    if size > 1024 * 1024:
        errs.add("FieldValueTooLong", "data", "Too long: must have at most 1048576 bytes")
    errs.raise_if_any(obj["kind"], obj["metadata"].get("name", ""))


def _decode_value(kind: str, field: str, value: Any) -> bytes:
    """A data value's bytes: base64 for Secret.data and binaryData, text for ConfigMap.data."""
    if not isinstance(value, str):
        raise bad_request(f"json: cannot unmarshal {type(value).__name__} into {field} value")
    if kind == "ConfigMap" and field == "data":
        return value.encode()
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(f"illegal base64 data in {kind} {field}") from None


def default_pod(pod: dict) -> None:
    """Fill in the defaults the API server sets on a new pod."""
    spec = pod["spec"]
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    spec.setdefault("serviceAccountName", spec.get("serviceAccount") or "default")
    spec.setdefault("serviceAccount", spec["serviceAccountName"])
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("priority", 0)
    spec.setdefault("tolerations", [
        {"key": f"node.kubernetes.io/{key}", "operator": "Exists", "effect": "NoExecute",
         "tolerationSeconds": 300} for key in ("not-ready", "unreachable")])
    for container in spec["containers"] + (spec.get("initContainers") or []):
        _default_container(container)
    pod["status"] = {"phase": "Pending", "qosClass": qos_class(pod)}


def _default_container(container: dict) -> None:
    image = container["image"]
    tag = image.rsplit("/", 1)[-1].partition(":")[2] if "@" not in image else "digest"
    container.setdefault("imagePullPolicy", "Always" if tag in ("", "latest") else "IfNotPresent")
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")
    resources = container.setdefault("resources", {})
    if resources.get("limits"):
        requests = resources.setdefault("requests", {})
        for name, value in resources["limits"].items():
            requests.setdefault(name, value)


def qos_class(pod: dict) -> str:
    """Guaranteed, Burstable or BestEffort, from the containers' cpu/memory requests/limits."""
    containers = pod["spec"]["containers"] + (pod["spec"].get("initContainers") or [])
    resources = [c.get("resources") or {} for c in containers]
    pairs = [(r.get("requests") or {}, r.get("limits") or {}) for r in resources]
    if not any(k in part for pair in pairs for part in pair for k in ("cpu", "memory")):
        return "BestEffort"
    guaranteed = all(
        k in limits and parse_quantity(requests.get(k, limits[k])) == parse_quantity(limits[k])
        for requests, limits in pairs for k in ("cpu", "memory"))
    return "Guaranteed" if guaranteed else "Burstable"


def pod_requests(pod: dict) -> Dict[str, Decimal]:
    """The pod's effective requests: the containers' sum, or the largest init container's."""
    total: Dict[str, Decimal] = {}
    for container in pod["spec"]["containers"]:
        for name, value in ((container.get("resources") or {}).get("requests") or {}).items():
            total[name] = total.get(name, Decimal(0)) + parse_quantity(value)
    for container in pod["spec"].get("initContainers") or []:
        for name, value in ((container.get("resources") or {}).get("requests") or {}).items():
            total[name] = max(total.get(name, Decimal(0)), parse_quantity(value))
    return total


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (also used for strategic merge patches: lists are replaced)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


# --------------------------------------------------------------------------------------
# The fake kubelet: one worker thread per pod bound to the node
# --------------------------------------------------------------------------------------
class ConfigError(Exception):
    """The container cannot be configured yet (a missing secret or key, no command)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


_VAR_REF = re.compile(r"\$\$|\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)")


def expand_vars(text: str, env: Dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: unknown references stay, ``$$`` escapes ``$``."""
    def replace(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))
    return _VAR_REF.sub(replace, text)


class PodRuntime:
    """What the fake kubelet knows of one pod bound to the node.

    The worker thread owns the process; API threads only set the ``deleting``/``evicted``
    requests, signal the process tree and wake the worker (all under the cluster lock).
    """

    def __init__(self, pod: dict, log_dir: str) -> None:
        meta = pod["metadata"]
        self.uid: str = meta["uid"]
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self.spec: dict = pod["spec"]
        self.container: dict = pod["spec"]["containers"][0]
        self.requests = pod_requests(pod)
        self.log_dir = log_dir
        self.wake = threading.Event()
        self.thread: Optional[threading.Thread] = None
        self.proc: Optional[subprocess.Popen] = None
        self.ps: Optional[psutil.Process] = None
        self.tree: Dict[int, psutil.Process] = {}
        self.group_released = True  # the process group id may no longer be ours
        self.deleting = False
        self.kill_at: Optional[float] = None
        self.evicted: Optional[str] = None
        self.oom = False
        self.deadline_exceeded = False
        self.done = False
        self.attempts = 0
        self.finished_attempts = 0
        self.active_since = time.monotonic()
        # what the kubelet reports
        self.phase = "Pending"
        self.state: dict = {"waiting": {"reason": "ContainerCreating"}}
        self.last_state: dict = {}
        self.restart_count = 0
        self.ready = False
        self.started = False
        self.image_id = ""
        self.container_id: Optional[str] = None
        self.start_time = _now()
        self.pod_ip: Optional[str] = None
        self.reason: Optional[str] = None
        self.message: Optional[str] = None
        self.transitions: Dict[str, Tuple[str, str]] = {}

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def stop_requested(self) -> bool:
        return self.deleting or self.evicted is not None

    def log_path(self, attempt: int) -> str:
        return os.path.join(self.log_dir, f"{attempt}.log")

    def sleep(self, seconds: Optional[float]) -> bool:
        """Wait up to ``seconds`` (None: forever); True when the pod must stop."""
        deadline = None if seconds is None else time.monotonic() + seconds
        while not self.stop_requested:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            self.wake.wait(remaining)
            self.wake.clear()
        return True


class Kubelet:
    """The fake scheduler and kubelet of the single node ``fake-node`` (process mode)."""

    def __init__(self, cluster: "FakeKubeCluster") -> None:
        self.cluster = cluster
        self.lock = cluster.cond
        self.runtimes: Dict[str, PodRuntime] = {}
        self.unbound: Dict[str, Tuple[str, str]] = {}
        self.stopping = False

    # -- scheduling ---------------------------------------------------------------------
    def capacity(self) -> Dict[str, Decimal]:
        """The node's allocatable resources."""
        cluster = self.cluster
        out = {"cpu": parse_quantity(cluster.node_cpu),
               "memory": parse_quantity(cluster.node_memory),
               "pods": Decimal(cluster.node_pods), "ephemeral-storage": parse_quantity("100Gi")}
        if cluster.node_gpus:
            out[GPU] = Decimal(cluster.node_gpus)
        return out

    def free(self) -> Dict[str, Decimal]:
        """Allocatable minus the requests of the bound pods that have not finished."""
        free = self.capacity()
        for rt in self.runtimes.values():
            if not rt.terminal:
                free["pods"] -= 1
                for name, amount in rt.requests.items():
                    free[name] = free.get(name, Decimal(0)) - amount
        return free

    def add(self, pod: dict) -> None:
        """A new pod to schedule (in creation order)."""
        self.unbound[pod["metadata"]["uid"]] = (pod["metadata"]["namespace"],
                                                pod["metadata"]["name"])

    def schedule(self) -> None:
        """Bind every unbound pod that fits; mark the others Unschedulable."""
        with self.lock:
            if self.stopping:
                return
            free = self.free()
            for uid, (ns, name) in list(self.unbound.items()):
                pod = self.cluster.store.get("Pod", ns, name)
                if pod is None or pod["metadata"]["uid"] != uid:
                    del self.unbound[uid]
                    continue
                requests = pod_requests(pod)
                node_name = pod["spec"].get("nodeName")
                if node_name and node_name != NODE_NAME:
                    continue  # bound by the client to a node that does not exist: Pending
                missing = [] if node_name else self._misfits(pod, requests, free)
                if missing:
                    self._mark_unschedulable(pod, missing)
                    continue
                for r, amount in requests.items():
                    free[r] = free.get(r, Decimal(0)) - amount
                free["pods"] -= 1
                del self.unbound[uid]
                self._bind(pod)

    @staticmethod
    def _misfits(pod: dict, requests: Dict[str, Decimal], free: Dict[str, Decimal]) -> List[str]:
        """Why the pod does not fit the node, as kube-scheduler words it (empty: it fits)."""
        selector = pod["spec"].get("nodeSelector") or {}
        if any(NODE_LABELS.get(k) != v for k, v in selector.items()):
            return ["1 node(s) didn't match Pod's node affinity/selector"]
        missing = [f"1 Insufficient {r}" for r, amount in sorted(requests.items())
                   if amount > free.get(r, Decimal(0))]
        return missing + (["1 Too many pods"] if free["pods"] < 1 else [])

    def _mark_unschedulable(self, pod: dict, missing: List[str]) -> None:
        reasons = ", ".join(missing)
        message = f"0/1 nodes are available: {reasons}{_UNSCHEDULABLE_TAIL}"
        current = [c for c in pod["status"].get("conditions") or []
                   if c.get("type") == "PodScheduled"]
        if current and current[0].get("message") == message:
            return
        new = copy.deepcopy(pod)
        new["status"]["conditions"] = [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": message, "lastProbeTime": None, "lastTransitionTime": _now()}]
        self.cluster.store.replace(new)

    def _bind(self, pod: dict) -> None:
        new = copy.deepcopy(pod)
        new["spec"]["nodeName"] = NODE_NAME
        new["status"]["conditions"] = [{"type": "PodScheduled", "status": "True",
                                        "lastProbeTime": None, "lastTransitionTime": _now()}]
        pod = self.cluster.store.replace(new)
        log_dir = os.path.join(self.cluster.workdir, "logs",
                               f"{pod['metadata']['namespace']}_{pod['metadata']['name']}_"
                               f"{pod['metadata']['uid']}")
        os.makedirs(log_dir, exist_ok=True)
        rt = PodRuntime(pod, log_dir)
        rt.transitions["PodScheduled"] = ("True", _now())
        self.runtimes[rt.uid] = rt
        rt.thread = threading.Thread(target=self._worker, args=(rt,), daemon=True,
                                     name=f"fake-kubelet-{rt.name}")
        rt.thread.start()

    # -- requests from the API and the test hooks ---------------------------------------
    def runtime(self, uid: str) -> Optional[PodRuntime]:
        with self.lock:
            return self.runtimes.get(uid)

    def forget(self, uid: str) -> None:
        """The pod left the store: stop counting it and stop its process if it still runs."""
        with self.lock:
            self.unbound.pop(uid, None)
            rt = self.runtimes.pop(uid, None)
            if rt is not None and not rt.done:
                self.request_stop(rt, 0)

    def request_stop(self, rt: PodRuntime, grace: int) -> None:
        """Deletion: SIGTERM the process tree now, SIGKILL it after ``grace`` seconds."""
        with self.lock:
            rt.deleting = True
            deadline = time.monotonic() + grace
            rt.kill_at = deadline if rt.kill_at is None else min(rt.kill_at, deadline)
            if grace <= 0:
                self._kill_tree(rt)
            else:
                self._terminate(rt)
            rt.wake.set()

    def evict(self, rt: PodRuntime, message: str) -> None:
        """Node-pressure eviction: kill the process tree, then report Failed/Evicted."""
        with self.lock:
            if rt.terminal or rt.done:
                return
            rt.evicted = message
            self._kill_tree(rt)
            rt.wake.set()

    def stop_all(self, timeout: float = 10.0) -> None:
        """Kill every pod's process tree and wait for the workers to end."""
        with self.lock:
            self.stopping = True
            runtimes = list(self.runtimes.values())
            for rt in runtimes:
                rt.deleting = True
                rt.kill_at = time.monotonic()
                self._kill_tree(rt)
                rt.wake.set()
        deadline = time.monotonic() + timeout
        for rt in runtimes:
            if rt.thread is not None:
                rt.thread.join(max(0.0, deadline - time.monotonic()))
            self._kill_tree(rt)
            if rt.thread is not None and rt.thread.is_alive():
                logger.warning("fake kubelet: worker of pod %s/%s did not stop",
                               rt.namespace, rt.name)

    # -- the worker ---------------------------------------------------------------------
    def _worker(self, rt: PodRuntime) -> None:
        try:
            self._publish(rt)
            if self._pull_image(rt):
                prepared = self._prepare(rt)
                if prepared is not None:
                    self._run_container(rt, *prepared)
                    return
            self._finish(rt, None)
        except Exception:  # a bug in the fake must not hang the test
            logger.exception("fake kubelet: pod %s/%s crashed the worker", rt.namespace, rt.name)
        finally:
            self._worker_done(rt)

    def _pull_image(self, rt: PodRuntime) -> bool:
        """ErrImagePull / ImagePullBackOff while the image is unpullable; False if stopped."""
        image = rt.container["image"]
        backoff = self.cluster.pull_backoff
        while self.cluster.is_unpullable(image):
            self._set_waiting(rt, "ErrImagePull", f'rpc error: code = NotFound desc = failed to '
                              f'pull and unpack image "{image}": not found')
            if rt.sleep(backoff):
                return False
            self._set_waiting(rt, "ImagePullBackOff", f'Back-off pulling image "{image}"')
            if rt.sleep(backoff):
                return False
            backoff = min(backoff * 2, 10.0)
        digest = hashlib.sha256(image.encode()).hexdigest()
        repository = re.sub(r"(:[^:/@]*)?(@.*)?$", "", image)
        rt.image_id = f"{repository}@sha256:{digest}"
        return True

    def _prepare(self, rt: PodRuntime) -> Optional[Tuple[List[str], Dict[str, str], Optional[str]]]:
        """argv, env and cwd of the container, retrying config errors; None if stopped."""
        while True:
            try:
                env = self.cluster.container_env(rt.namespace, rt.name, rt.container)
                command = list(rt.container.get("command") or [])
                if not command:
                    raise ConfigError("CreateContainerError", "fake kubelet (process mode) "
                                      "needs the container's command: it cannot run an "
                                      "image's entrypoint")
                argv = [expand_vars(a, env) for a in command + list(rt.container.get("args") or [])]
                return argv, env, rt.container.get("workingDir")
            except ConfigError as exc:
                self._set_waiting(rt, exc.reason, str(exc))
            if rt.sleep(self.cluster.pull_backoff):
                return None

    def _run_container(self, rt: PodRuntime, argv: List[str], env: Dict[str, str],
                       cwd: Optional[str]) -> None:
        """Run (and restart, per restartPolicy) the container until it is done for good."""
        backoff = self.cluster.restart_backoff
        while True:
            terminated = self._run_once(rt, argv, env, cwd)
            if not self._should_restart(rt, terminated["exitCode"]):
                self._finish(rt, terminated)
                return
            with self.lock:
                rt.restart_count += 1
                rt.last_state = {"terminated": terminated}
                rt.ready = rt.started = False
                rt.state = {"waiting": {"reason": "CrashLoopBackOff", "message": (
                    f"back-off {backoff:g}s restarting failed container={rt.container['name']} "
                    f"pod={rt.name}_{rt.namespace}({rt.uid})")}}
            self._publish(rt)
            if rt.sleep(backoff):
                self._finish(rt, None)
                return
            backoff = min(backoff * 2, 10.0)

    def _should_restart(self, rt: PodRuntime, exit_code: int) -> bool:
        if rt.stop_requested or rt.deadline_exceeded or self.stopping:
            return False
        policy = rt.spec.get("restartPolicy", "Always")
        return policy == "Always" or (policy == "OnFailure" and exit_code != 0)

    def _run_once(self, rt: PodRuntime, argv: List[str], env: Dict[str, str],
                  cwd: Optional[str]) -> dict:
        """Start the process, watch it until it ends; its ``terminated`` state."""
        rt.attempts += 1
        try:
            return self._run_process(rt, argv, env, cwd)
        finally:
            rt.finished_attempts = rt.attempts

    def _run_process(self, rt: PodRuntime, argv: List[str], env: Dict[str, str],
                     cwd: Optional[str]) -> dict:
        started_at = _now()
        try:
            self._spawn(rt, argv, env, cwd)
        except OSError as exc:
            return {"exitCode": 128, "reason": "StartError", "startedAt": _ts(0),
                    "finishedAt": _now(), "message": (
                        f"failed to create containerd task: exec: \"{argv[0]}\": "
                        f"{exc.strerror or exc}")}
        with self.lock:
            rt.state = {"running": {"startedAt": started_at}}
            rt.ready = rt.started = True
            rt.pod_ip = POD_IP
            rt.phase = "Running"
        self._publish(rt)
        returncode = self._monitor(rt)
        logger.debug("fake kubelet: pod %s/%s pid %d exited with %d", rt.namespace, rt.name,
                     rt.proc.pid, returncode)
        self._kill_tree(rt)  # the container's other processes die with it
        rt.group_released = True
        exit_code = returncode if returncode >= 0 else 128 - returncode
        reason = "Completed" if exit_code == 0 else "Error"
        if rt.oom:
            exit_code, reason = 137, "OOMKilled"
        return {"exitCode": exit_code, "reason": reason, "startedAt": started_at,
                "finishedAt": _now(), "containerID": rt.container_id}

    def _spawn(self, rt: PodRuntime, argv: List[str], env: Dict[str, str],
               cwd: Optional[str]) -> None:
        if cwd:
            os.makedirs(cwd, exist_ok=True)
        with open(rt.log_path(rt.attempts), "ab") as log:
            proc = subprocess.Popen(argv, env=env, cwd=cwd or None, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        with self.lock:
            rt.proc = proc
            rt.tree = {}
            rt.group_released = False
            rt.oom = False
            try:
                rt.ps = psutil.Process(proc.pid)
            except psutil.Error:
                rt.ps = None
            rt.container_id = f"fakeprocess://{proc.pid}"
            if rt.stop_requested or self.stopping:  # a request came in while it started
                if rt.evicted is not None or self.stopping or rt.kill_at <= time.monotonic():
                    self._kill_tree(rt)
                else:
                    self._terminate(rt)
        logger.debug("fake kubelet: pod %s/%s runs pid %d: %s", rt.namespace, rt.name,
                     proc.pid, argv)

    def _monitor(self, rt: PodRuntime) -> int:
        """Wait for the process, enforcing memory limit, deadline and deletion grace."""
        limit = ((rt.container.get("resources") or {}).get("limits") or {}).get("memory")
        limit_bytes = parse_quantity(limit) if limit is not None else None
        deadline = rt.spec.get("activeDeadlineSeconds")
        poll = self.cluster.poll_interval
        while True:
            wait = poll
            if rt.kill_at is not None:
                wait = max(0.01, min(poll, rt.kill_at - time.monotonic()))
            try:
                return rt.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                pass
            rss = self._track_tree(rt)
            if limit_bytes is not None and rss > limit_bytes and not rt.oom:
                logger.info("fake kubelet: pod %s/%s over its memory limit (%d > %s): OOMKilled",
                            rt.namespace, rt.name, rss, limit)
                rt.oom = True
                self._kill_tree(rt)
            if deadline and time.monotonic() - rt.active_since > deadline:
                rt.deadline_exceeded = True
                self._kill_tree(rt)
            if rt.kill_at is not None and time.monotonic() >= rt.kill_at:
                self._kill_tree(rt)

    def _track_tree(self, rt: PodRuntime) -> int:
        """Remember the process's descendants; the RSS of the whole tree in bytes."""
        if rt.ps is None:
            return 0
        try:
            procs = [rt.ps] + rt.ps.children(recursive=True)
        except psutil.Error:
            return 0
        with self.lock:
            for proc in procs:
                rt.tree.setdefault(proc.pid, proc)
        rss = 0
        for proc in procs:
            try:
                rss += proc.memory_info().rss
            except psutil.Error:
                pass
        return rss

    def _terminate(self, rt: PodRuntime) -> None:
        """SIGTERM the container's main process only, as the runtime signals PID 1."""
        with self.lock:
            if rt.ps is not None:
                try:
                    rt.ps.send_signal(signal.SIGTERM)
                except psutil.Error:
                    pass

    def _kill_tree(self, rt: PodRuntime) -> None:
        """SIGKILL the process group and every descendant seen (all the container's processes)."""
        with self.lock:
            if rt.proc is None:
                return
            procs = list(rt.tree.values())
            if rt.ps is not None:
                procs.append(rt.ps)
                try:
                    procs.extend(rt.ps.children(recursive=True))
                except psutil.Error:
                    pass
            if not rt.group_released:  # once released, its id could be another group's
                try:
                    os.killpg(rt.proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            for proc in procs:
                try:
                    proc.send_signal(signal.SIGKILL)
                except psutil.Error:
                    pass

    def _finish(self, rt: PodRuntime, terminated: Optional[dict]) -> None:
        """Report the pod's terminal phase (unless it is being deleted before it ran)."""
        with self.lock:
            if terminated is None and rt.deleting and rt.evicted is None:
                return
            rt.ready = False
            if terminated is not None:
                rt.state = {"terminated": terminated}
            exit_code = terminated["exitCode"] if terminated else 1
            rt.phase = "Succeeded" if exit_code == 0 else "Failed"
            if rt.evicted is not None:
                rt.phase, rt.reason, rt.message = "Failed", "Evicted", rt.evicted
            elif rt.deadline_exceeded:
                rt.phase, rt.reason = "Failed", "DeadlineExceeded"
                rt.message = "Pod was active on the node longer than the specified deadline"
        self._publish(rt)

    def _worker_done(self, rt: PodRuntime) -> None:
        with self.lock:
            rt.done = True
            if rt.deleting and self.runtimes.get(rt.uid) is rt:
                self.cluster.remove_object("Pod", rt.namespace, rt.name, uid=rt.uid)
            self.schedule()

    # -- status reporting ---------------------------------------------------------------
    def _set_waiting(self, rt: PodRuntime, reason: str, message: str) -> None:
        with self.lock:
            rt.state = {"waiting": {"reason": reason, "message": message}}
        self._publish(rt)

    def _publish(self, rt: PodRuntime) -> None:
        """Write the runtime's view into the pod's status (MODIFIED if anything changed)."""
        with self.lock:
            pod = self.cluster.store.get("Pod", rt.namespace, rt.name)
            if pod is None or pod["metadata"]["uid"] != rt.uid:
                return
            new = copy.deepcopy(pod)
            new["status"] = self._pod_status(rt, pod)
            self.cluster.store.replace(new)

    def _pod_status(self, rt: PodRuntime, pod: dict) -> dict:
        status = {"phase": rt.phase, "conditions": self._conditions(rt),
                  "hostIP": HOST_IP, "hostIPs": [{"ip": HOST_IP}], "startTime": rt.start_time,
                  "qosClass": pod["status"].get("qosClass"),
                  "containerStatuses": [self._container_status(rt)]}
        if rt.pod_ip:
            status["podIP"] = rt.pod_ip
            status["podIPs"] = [{"ip": rt.pod_ip}]
        if rt.reason:
            status["reason"] = rt.reason
        if rt.message:
            status["message"] = rt.message
        return status

    def _container_status(self, rt: PodRuntime) -> dict:
        status = {"name": rt.container["name"], "image": rt.container["image"],
                  "imageID": rt.image_id, "ready": rt.ready, "restartCount": rt.restart_count,
                  "started": rt.started, "state": rt.state, "lastState": rt.last_state}
        if rt.container_id:
            status["containerID"] = rt.container_id
        return status

    def _conditions(self, rt: PodRuntime) -> List[dict]:
        not_ready = ("PodCompleted", None) if rt.terminal and rt.evicted is None else (
            "ContainersNotReady", f"containers with unready status: [{rt.container['name']}]")
        wanted = [("PodReadyToStartContainers", rt.pod_ip is not None and not rt.terminal, None),
                  ("Initialized", True, None),
                  ("Ready", rt.ready, None if rt.ready else not_ready),
                  ("ContainersReady", rt.ready, None if rt.ready else not_ready),
                  ("PodScheduled", True, None)]
        if rt.evicted is not None:
            wanted.append(("DisruptionTarget", True, ("TerminationByKubelet", rt.evicted)))
        return [self._condition(rt, kind, ok, why) for kind, ok, why in wanted]

    @staticmethod
    def _condition(rt: PodRuntime, kind: str, ok: bool,
                   why: Optional[Tuple[str, Optional[str]]]) -> dict:
        status = "True" if ok else "False"
        previous = rt.transitions.get(kind)
        if previous is None or previous[0] != status:
            rt.transitions[kind] = previous = (status, _now())
        cond = {"type": kind, "status": status, "lastProbeTime": None,
                "lastTransitionTime": previous[1]}
        if why is not None:
            cond["reason"] = why[0]
            if why[1]:
                cond["message"] = why[1]
        return cond


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


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 128  # bursts of clients must not wait for SYN retries

    def __init__(self, address: Tuple[str, int], cluster: "FakeKubeCluster") -> None:
        self.cluster = cluster
        self.api = CoreV1Api(cluster)
        self.connections: Set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def close_connections(self) -> None:
        with self.connections_lock:
            for conn in list(self.connections):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class _Handler(BaseHTTPRequestHandler):
    """HTTP/1.1 with keep-alive; watches and followed logs are chunked streams."""
    protocol_version = "HTTP/1.1"
    server_version = "fake-kube-apiserver"
    sys_version = ""
    timeout = 120  # idle keep-alive connections are closed after this
    server: _Server

    def setup(self) -> None:
        super().setup()
        with self.server.connections_lock:
            self.server.connections.add(self.connection)

    def finish(self) -> None:
        with self.server.connections_lock:
            self.server.connections.discard(self.connection)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib's name)
        logger.debug("fake kube-apiserver: " + format, *args)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def _serve(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        req = Request(method, url.path, query, body, self.headers.get("Content-Type") or "",
                      self._client_gone)
        try:
            self._check_auth(url.path)
            response = self.server.api.handle(req)
        except ApiError as exc:
            response = Response(exc.code, exc.status())
        except Exception as exc:  # a bug in the fake: answer 500 like the API server would
            logger.exception("fake kube-apiserver: %s %s failed", method, self.path)
            response = Response(500, ApiError(500, "InternalError", str(exc)).status())
        self._send(response)

    def _check_auth(self, path: str) -> None:
        if path.rstrip("/") in ("/version", "/healthz", "/readyz", "/livez"):
            return
        if self.headers.get("Authorization") != f"Bearer {self.server.cluster.token}":
            raise ApiError(401, "Unauthorized", "Unauthorized")

    def _send(self, response: Response) -> None:
        if response.stream is not None:
            self._send_stream(response)
            return
        if isinstance(response.body, (dict, list)):
            data = json.dumps(response.body).encode()
        else:
            data = str(response.body).encode()
        self.send_response(response.code)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        self.wfile.write(data)

    def _send_stream(self, response: Response) -> None:
        self.send_response(response.code)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        try:
            for piece in response.stream:
                if piece:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:  # the client went away
            self.close_connection = True
        finally:
            response.stream.close()

    def _client_gone(self) -> bool:
        """Whether the client closed the connection (no request is pipelined in a stream)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True


# --------------------------------------------------------------------------------------
# The public class
# --------------------------------------------------------------------------------------
class FakeKubeCluster:
    """An in-repo fake of the Kubernetes core/v1 API for tests; NOT a real cluster.

    One fake node ``fake-node`` with ``node_cpu`` CPUs, ``node_memory`` memory, ``node_gpus``
    ``nvidia.com/gpu`` and room for ``node_pods`` pods. Pods run as local processes
    (``kubelet="process"``, the only mode). Drive it with the real ``kubernetes`` client
    through :attr:`kubeconfig_path` or :meth:`api_client`.

    Test hooks: :attr:`unpullable` (image substrings that fail to pull), :meth:`evict`,
    :meth:`compact` (expire watch history), :meth:`pod_pid`, :meth:`log_path`.
    """

    def __init__(self, node_cpu: Any = 16, node_memory: Any = "16Gi", kubelet: str = "process",
                 *, node_gpus: int = 0, node_pods: int = 110, token: Optional[str] = None,
                 workdir: Optional[str] = None, poll_interval: float = 0.2,
                 pull_backoff: float = 0.5, restart_backoff: float = 0.5,
                 service_env: bool = True, max_events: int = 10000) -> None:
        if kubelet != "process":
            raise ValueError(f"unsupported fake kubelet {kubelet!r}: only 'process' exists "
                             "(a 'docker' kubelet is not implemented)")
        for quantity in (node_cpu, node_memory):
            parse_quantity(quantity)  # fail early on a bad value
        self.node_cpu, self.node_memory = str(node_cpu), str(node_memory)
        self.node_gpus, self.node_pods = int(node_gpus), int(node_pods)
        self.kubelet_mode = kubelet
        self.token = token or f"fake-token-{uuid.uuid4().hex}"
        self.poll_interval = poll_interval
        self.pull_backoff = pull_backoff
        self.restart_backoff = restart_backoff
        self.service_env = service_env
        #: an image whose name contains any of these strings fails to pull
        self.unpullable: Set[str] = {"does-not-exist"}
        self.namespaces: Set[str] = set(DEFAULT_NAMESPACES)
        self.cond = threading.Condition(threading.RLock())
        self.store = Store(self.cond, max_events)
        self.kubelet = Kubelet(self)
        self._own_workdir = workdir is None
        self.workdir = workdir or ""
        self.host = "127.0.0.1"
        self.port = 0
        self.kubeconfig_path = ""
        self.started_at = time.time()
        self.stopping = False
        self._server: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> "FakeKubeCluster":
        """Serve on 127.0.0.1:<free port> in a background thread and write the kubeconfig."""
        if self._server is not None:
            return self
        if self._own_workdir:
            self.workdir = tempfile.mkdtemp(prefix="fake-kube-")
        os.makedirs(self.workdir, exist_ok=True)
        self._server = _Server((self.host, 0), self)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.1}, daemon=True,
                                        name="fake-kube-apiserver")
        self._thread.start()
        self.kubeconfig_path = self._write_kubeconfig()
        logger.info("fake Kubernetes API (NOT a real cluster) at %s", self.url)
        return self

    def stop(self) -> None:
        """Kill every pod's processes, stop the server, remove the temporary workdir."""
        if self._server is None:
            return
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self.kubelet.stop_all()
        self._server.shutdown()
        self._server.close_connections()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(10)
        self._server = None
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "FakeKubeCluster":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _write_kubeconfig(self) -> str:
        config = {
            "apiVersion": "v1", "kind": "Config", "preferences": {},
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": self.token}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake",
                                                      "namespace": "default"}}],
            "current-context": "fake",
        }
        path = os.path.join(self.workdir, "kubeconfig")
        with open(path, "w", encoding="utf-8") as out:
            json.dump(config, out, indent=2)  # JSON is YAML: load_kube_config reads it
        return path

    def api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` configured from :attr:`kubeconfig_path`."""
        from kubernetes import config  # the fake itself needs only the stdlib and psutil
        return config.new_client_from_config(config_file=self.kubeconfig_path)

    # -- test hooks ---------------------------------------------------------------------
    def is_unpullable(self, image: str) -> bool:
        """Whether the fake kubelet fails to pull ``image`` (see :attr:`unpullable`)."""
        return any(part in image for part in self.unpullable)

    def evict(self, namespace: str, name: str,
              message: str = "The node was low on resource: memory.") -> None:
        """Evict a pod as the kubelet does under node pressure: kill its processes and
        report phase Failed, reason ``Evicted`` and ``message``. KeyError if no such pod."""
        with self.cond:
            pod = self.store.get("Pod", namespace, name)
            if pod is None:
                raise KeyError(f"no pod {namespace}/{name}")
            rt = self.kubelet.runtime(pod["metadata"]["uid"])
            if rt is not None:
                self.kubelet.evict(rt, message)
                return
            new = copy.deepcopy(pod)  # not bound yet: fail it in place
            new["status"].update(phase="Failed", reason="Evicted", message=message)
            self.kubelet.unbound.pop(pod["metadata"]["uid"], None)
            self.store.replace(new)

    def compact(self) -> None:
        """Forget the watch history: watches from an older resourceVersion get 410 Expired."""
        self.store.compact()

    def pod_pid(self, namespace: str, name: str) -> Optional[int]:
        """The pid of the pod's current container process (None if it has none)."""
        with self.cond:
            pod = self.store.get("Pod", namespace, name)
            rt = pod and self.kubelet.runtime(pod["metadata"]["uid"])
            return rt.proc.pid if rt and rt.proc is not None else None

    def log_path(self, namespace: str, name: str) -> Optional[str]:
        """The file holding the pod's current container log (None before it started)."""
        with self.cond:
            pod = self.store.get("Pod", namespace, name)
            rt = pod and self.kubelet.runtime(pod["metadata"]["uid"])
            return rt.log_path(rt.attempts) if rt and rt.attempts else None

    # -- objects: creation, deletion and garbage collection -----------------------------
    def add_object(self, obj: dict) -> dict:
        """Store a new (validated) object; schedule pods; collect an orphan at once."""
        with self.cond:
            stored = self.store.add(obj)
            if obj["kind"] == "Pod":
                self.kubelet.add(stored)
            if stored["metadata"].get("ownerReferences") and not self._has_live_owner(stored):
                logger.info("fake GC: %s %s/%s has no live owner: deleting it", obj["kind"],
                            stored["metadata"]["namespace"], stored["metadata"]["name"])
                self.delete_object(obj["kind"], stored["metadata"]["namespace"],
                                   stored["metadata"]["name"])
            if obj["kind"] == "Pod":
                self.kubelet.schedule()
            return stored

    def delete_object(self, kind: str, ns: str, name: str, grace: Optional[int] = None,
                      propagation: str = "Background") -> Optional[dict]:
        """Delete like the API server: pods with a live process terminate gracefully first
        (the returned pod carries deletionTimestamp), anything else goes at once."""
        with self.cond:
            obj = self.store.get(kind, ns, name)
            if obj is None:
                return None
            if propagation == "Orphan":
                self._orphan_dependents(obj)
            elif propagation == "Foreground":
                for dep in self._dependents(obj):
                    self.delete_object(dep["kind"], ns, dep["metadata"]["name"],
                                       propagation="Foreground")
            if kind != "Pod":
                return self.remove_object(kind, ns, name)
            return self._delete_pod(obj, grace)

    def _delete_pod(self, pod: dict, grace: Optional[int]) -> Optional[dict]:
        meta = pod["metadata"]
        if grace is None:
            grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
        rt = self.kubelet.runtime(meta["uid"])
        if rt is None or rt.done or grace == 0:
            return self.remove_object("Pod", meta["namespace"], meta["name"])
        current = meta.get("deletionGracePeriodSeconds")
        if current is None or grace < current:
            new = copy.deepcopy(pod)
            new["metadata"]["deletionTimestamp"] = _ts(time.time() + grace)
            new["metadata"]["deletionGracePeriodSeconds"] = grace
            pod = self.store.replace(new)
            self.kubelet.request_stop(rt, grace)
        return pod

    def remove_object(self, kind: str, ns: str, name: str,
                      uid: Optional[str] = None) -> Optional[dict]:
        """Take an object out of the store (DELETED), then collect its dependents."""
        with self.cond:
            current = self.store.get(kind, ns, name)
            if current is None or (uid is not None and current["metadata"]["uid"] != uid):
                return None
            obj = self.store.remove(kind, ns, name)
            if kind == "Pod":
                self.kubelet.forget(obj["metadata"]["uid"])
            for dep in self._dependents(obj):
                if not self._has_live_owner(dep):
                    self.delete_object(dep["kind"], ns, dep["metadata"]["name"])
            if kind == "Pod":
                self.kubelet.schedule()
            return obj

    def _dependents(self, owner: dict) -> List[dict]:
        uid, ns = owner["metadata"]["uid"], owner["metadata"]["namespace"]
        return [obj for kind in KINDS.values() for obj in self.store.values(kind, ns)
                if any(ref.get("uid") == uid
                       for ref in obj["metadata"].get("ownerReferences") or [])]

    def _has_live_owner(self, obj: dict) -> bool:
        """Whether any owner still exists (owners of kinds this fake does not serve are
        assumed to exist)."""
        ns = obj["metadata"]["namespace"]
        for ref in obj["metadata"].get("ownerReferences") or []:
            if ref.get("kind") not in PLURALS or ref.get("apiVersion") != "v1":
                return True
            owner = self.store.get(ref["kind"], ns, ref.get("name", ""))
            if owner is not None and owner["metadata"]["uid"] == ref.get("uid"):
                return True
        return False

    def _orphan_dependents(self, owner: dict) -> None:
        uid = owner["metadata"]["uid"]
        for dep in self._dependents(owner):
            new = copy.deepcopy(dep)
            refs = [r for r in new["metadata"]["ownerReferences"] if r.get("uid") != uid]
            if refs:
                new["metadata"]["ownerReferences"] = refs
            else:
                del new["metadata"]["ownerReferences"]
            self.store.replace(new)

    # -- what the kubelet needs ---------------------------------------------------------
    def node(self) -> dict:
        """The ``fake-node`` Node object."""
        capacity = {"cpu": self.node_cpu, "memory": self.node_memory,
                    "pods": str(self.node_pods), "ephemeral-storage": "100Gi"}
        if self.node_gpus:
            capacity[GPU] = str(self.node_gpus)
        info = {"architecture": "amd64", "bootID": "fake", "containerRuntimeVersion":
                f"fake-{self.kubelet_mode}://0", "kernelVersion": os.uname().release,
                "kubeProxyVersion": KUBE_VERSION["gitVersion"],
                "kubeletVersion": KUBE_VERSION["gitVersion"], "machineID": "fake",
                "operatingSystem": "linux", "osImage": "fake", "systemUUID": "fake"}
        return {"kind": "Node", "apiVersion": "v1",
                "metadata": {"name": NODE_NAME, "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS,
                                                                       NODE_NAME)),
                             "resourceVersion": "1",
                             "creationTimestamp": _ts(self.started_at),
                             "labels": dict(NODE_LABELS)},
                "spec": {},
                "status": {"capacity": capacity, "allocatable": dict(capacity),
                           "conditions": [{"type": "Ready", "status": "True",
                                           "reason": "KubeletReady",
                                           "message": "kubelet is posting ready status"}],
                           "addresses": [{"type": "InternalIP", "address": HOST_IP},
                                         {"type": "Hostname", "address": NODE_NAME}],
                           "nodeInfo": info}}

    def container_env(self, ns: str, pod_name: str, container: dict) -> Dict[str, str]:
        """The container's environment: PATH/HOME/LANG of this process, HOSTNAME, the
        kubernetes service variables, then envFrom and env (ConfigError if unresolvable)."""
        with self.cond:
            pod = self.store.get("Pod", ns, pod_name)
            if pod is None:
                raise ConfigError("CreateContainerConfigError", "pod is gone")
            env = {k: os.environ[k] for k in BASE_ENV_VARS if k in os.environ}
            env["HOSTNAME"] = pod_name
            if self.service_env:
                env.update(KUBERNETES_SERVICE_HOST=self.host,
                           KUBERNETES_SERVICE_PORT=str(self.port),
                           KUBERNETES_PORT=f"tcp://{self.host}:{self.port}")
            for source in container.get("envFrom") or []:
                env.update(self._env_from(ns, source))
            for var in container.get("env") or []:
                value = self._env_value(pod, container, var, env)
                if value is not None:
                    env[var["name"]] = value
            return env

    def _env_from(self, ns: str, source: dict) -> Dict[str, str]:
        kind, ref = ("Secret", source.get("secretRef")) if source.get("secretRef") else \
            ("ConfigMap", source.get("configMapRef") or {})
        obj = self.store.get(kind, ns, ref.get("name", ""))
        if obj is None:
            if ref.get("optional"):
                return {}
            raise ConfigError("CreateContainerConfigError",
                              f'{kind.lower()} "{ref.get("name")}" not found')
        prefix = source.get("prefix", "")
        return {prefix + key: self._config_value(obj, key) for key in obj.get("data") or {}
                if _ENV_NAME.match(prefix + key)}

    def _env_value(self, pod: dict, container: dict, var: dict,
                   env: Dict[str, str]) -> Optional[str]:
        source = var.get("valueFrom")
        if not source:
            return expand_vars(var.get("value") or "", env)
        for field, kind in (("secretKeyRef", "Secret"), ("configMapKeyRef", "ConfigMap")):
            if source.get(field):
                return self._key_ref(kind, pod["metadata"]["namespace"], source[field])
        if source.get("fieldRef"):
            return _field_ref(pod, source["fieldRef"]["fieldPath"])
        return self._resource_ref(container, source["resourceFieldRef"])

    def _key_ref(self, kind: str, ns: str, ref: dict) -> Optional[str]:
        obj = self.store.get(kind, ns, ref["name"])
        if obj is None:
            if ref.get("optional"):
                return None
            raise ConfigError("CreateContainerConfigError",
                              f'{kind.lower()} "{ref["name"]}" not found')
        if ref["key"] not in (obj.get("data") or {}):
            if ref.get("optional"):
                return None
            raise ConfigError("CreateContainerConfigError",
                              f"couldn't find key {ref['key']} in {kind} {ns}/{ref['name']}")
        return self._config_value(obj, ref["key"])

    @staticmethod
    def _config_value(obj: dict, key: str) -> str:
        value = obj["data"][key]
        if obj["kind"] == "Secret":
            return base64.b64decode(value).decode("utf-8", "replace")
        return value

    def _resource_ref(self, container: dict, ref: dict) -> str:
        part, _, name = ref.get("resource", "").partition(".")
        resources = container.get("resources") or {}
        value = (resources.get(part) or {}).get(name)
        if value is None:  # limits default to the node's allocatable, requests to 0
            value = self.kubelet.capacity().get(name, 0) if part == "limits" else 0
        amount = parse_quantity(value) / parse_quantity(ref.get("divisor") or "1")
        return str(math.ceil(amount))  # rounded up, like the kubelet


def _field_ref(pod: dict, path: str) -> str:
    """The value of a downward-API ``fieldRef``."""
    meta = pod["metadata"]
    match = re.match(r"^metadata\.(labels|annotations)\['(.+)'\]$", path)
    if match:
        return (meta.get(match.group(1)) or {}).get(match.group(2), "")
    values = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"],
              "metadata.uid": meta["uid"], "spec.nodeName": NODE_NAME,
              "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
              "status.hostIP": HOST_IP, "status.hostIPs": HOST_IP,
              "status.podIP": POD_IP, "status.podIPs": POD_IP}
    return values.get(path, "")
