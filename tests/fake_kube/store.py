"""The fake API server's object store and object rules: the versioned ``Store`` with its watch
``Event`` stream, validation of pods, secrets and configmaps, the defaults the API server
fills in, QoS and resource-request helpers, and JSON merge patch. Part of the in-repo FAKE
Kubernetes core/v1 API used by tests (see ``fake_kube``); NOT a real cluster.
"""
from __future__ import annotations

import base64
import binascii
import bisect
import copy
import re
import threading
from decimal import Decimal, InvalidOperation
from typing import Any, Dict, List, NamedTuple, Optional, Set, Tuple

from .objects import (FieldErrors, _CONFIG_KEY, _ENV_NAME, _dns_label_error, _label_key_error,
                      _label_value_error, bad_request, dns_subdomain_error, parse_quantity)


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
