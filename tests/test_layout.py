"""The layout shows the layers: no import circles in fiberrl, rl or cpe, and the wire and
the runtime import nothing from the layers above them."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fiberrl", "rl", "cpe")


def _modules():
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _imports(name, path, modules):
    """Every fiberrl/rl/cpe module ``name`` imports, at module level or inside a function."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            subs = [f"{base}.{alias.name}" for alias in node.names
                    if f"{base}.{alias.name}" in modules]
            names = subs or [base]
        else:
            continue
        for target in names:
            while target and target not in modules:   # a name inside a module: the module
                target = target.rpartition(".")[0]
            if target and target != name:
                targets.add(target)
    return targets


def _graph():
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph):
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_circles():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_lower_layers_import_nothing_above_them():
    """The wire imports only errors and config; the runtime only the wire, errors, config
    and (for the listen address) the backends."""
    graph = _graph()
    allowed = {
        "fiberrl._wire": {"fiberrl._wire", "fiberrl.errors", "fiberrl.config"},
        "fiberrl._runtime": {"fiberrl._wire", "fiberrl._runtime", "fiberrl.errors",
                             "fiberrl.config", "fiberrl.backends"},
    }
    for layer, ok in allowed.items():
        for name, targets in graph.items():
            if name == layer or name.startswith(layer + "."):
                above = {t for t in targets if not any(t == a or t.startswith(a + ".")
                                                        for a in ok)}
                assert not above, f"{name} imports {sorted(above)} from above its layer"


def test_every_relative_import_names_a_module_that_exists():
    """A module moved into a package keeps working only if its relative imports moved
    with it (``from .resources`` inside fiberrl/cli/ is fiberrl.cli.resources)."""
    modules = _modules()
    missing = []
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
                if base not in modules:
                    missing.append(f"{name}:{node.lineno} imports {base}")
    assert missing == []


def test_every_error_a_user_can_see_is_importable_from_fiberrl():
    """Each exception class fiberrl.errors defines is exported by fiberrl and derives
    from a stdlib type users already catch."""
    import fiberrl
    import fiberrl.errors as errors
    internal = {"NotHereError", "ForkServerError", "UnlockedReleaseError", "NotOwnerError",
                "NegativeSemaphoreError",
                "ClientGone"}
    for name in errors.__all__:
        cls = getattr(errors, name)
        if name in internal:   # handled inside fiberrl; surface as their stdlib bases
            continue
        assert getattr(fiberrl, name) is cls, name
        assert cls.__mro__[1] is not object, name
