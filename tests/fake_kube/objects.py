"""Shared constants of the fake cluster and the pure helpers of its API objects: the
Status errors (``ApiError``, ``FieldErrors``), resource quantities, name and label
validation, and the label and field selectors used by list, watch and delete collection.
Part of the in-repo FAKE Kubernetes core/v1 API used by tests (see ``fake_kube``); NOT a
real cluster.
"""
from __future__ import annotations

import json
import re
import time
from decimal import Decimal
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

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
