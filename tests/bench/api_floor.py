"""What a package's newer release added to its Python API, read statically from the two
releases' sources (no import: the older one need not be installable here), and where code
uses any of it.

The engine runs on the GPU image's torch 2.11 and triton 3.6 while the pinned ones here are
newer, so a call to anything added since would pass every local test and fail on the
device. The diff is made once from both wheels and committed (torch_api_added.json):

    pip download --no-deps torch==2.11.0 -d /tmp/old && unzip -q /tmp/old/torch-*.whl \\
        'torch/*.py' 'torch/*.pyi' -d /tmp/old/tree
    (the same for the pinned wheel into /tmp/new/tree)
    python tests/bench/api_floor.py /tmp/old/tree /tmp/new/tree torch \
        > tests/bench/torch_api_added.json

and the same for triton (the GPU image's 3.6 against the pinned one; site-packages can serve
as the newer tree) into triton_api_added.json. test_api_floor.py reads both.

A module's surface is what its .py/.pyi files define or import at top level (functions
with their parameter names, classes with their methods'); `torch` also star-exports its
C functions (_C/_VariableFunctions.pyi); tensors' methods are those of torch's Tensor and
TensorBase, or of triton.language's tensor. "Added" means: a name in the newer surface of a
module and not in the older one; a tensor method name no older tensor class had; a
parameter a function or method gained.
"""

import ast
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

Params = set[str]
# module -> name -> parameter names (None: not a function)
Surface = dict[str, dict[str, Params | None]]
# The C extension's functions that a package's top module star-exports.
STAR_EXPORTS = {"torch": ["torch._C._VariableFunctions"]}
# The classes whose methods any value in kernel or engine code may have.
TENSOR_CLASSES = {
    "torch": [("torch._tensor", "Tensor"), ("torch._C", "TensorBase")],
    "triton": [("triton.language.core", "tensor")],
}


def _params(node: ast.FunctionDef | ast.AsyncFunctionDef) -> Params:
    a = node.args
    return {p.arg for p in a.posonlyargs + a.args + a.kwonlyargs} - {"self", "cls"}


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _origin(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` names."""
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def read_surface(root: Path, package: str) -> tuple[Surface, dict[str, dict[str, Params]]]:
    """(module -> name -> params, "module.Class" -> method -> params) of every file. A name
    a module imports from another takes the parameters it has there (tl.load is core's)."""
    surface: Surface = defaultdict(dict)
    methods: dict[str, dict[str, Params]] = defaultdict(dict)
    origins: list[tuple[str, str, str, str]] = []  # module, name, source module, source name
    for path in sorted((root / package).rglob("*.py*")):
        if path.suffix not in (".py", ".pyi"):
            continue
        module = module_name(root, path)
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        names = surface[module]
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names[node.name] = (names.get(node.name) or set()) | _params(node)
            elif isinstance(node, ast.ClassDef):
                names.setdefault(node.name, None)
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        known = methods[f"{module}.{node.name}"].get(item.name, set())
                        methods[f"{module}.{node.name}"][item.name] = known | _params(item)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            names.setdefault(name.id, None)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    names.setdefault(alias.asname or alias.name.split(".")[0], None)
            elif isinstance(node, ast.ImportFrom):
                source = _origin(module, path.stem == "__init__", node)
                for alias in node.names:
                    if alias.name != "*":
                        names.setdefault(alias.asname or alias.name, None)
                        origins.append((module, alias.asname or alias.name, source, alias.name))
    for _ in range(3):  # re-exports of re-exports
        for module, imported, source, source_name in origins:
            params = surface.get(source, {}).get(source_name)
            if params is not None and surface[module].get(imported) is None:
                surface[module][imported] = params
    for top, sources in STAR_EXPORTS.items():
        for star in sources:
            for exported, params in surface.get(star, {}).items():
                surface[top].setdefault(exported, params)
    return surface, methods


def tensor_methods(methods: dict[str, dict[str, Params]], package: str) -> dict[str, Params]:
    merged: dict[str, Params] = {}
    for module, cls in TENSOR_CLASSES[package]:
        for name, params in methods.get(f"{module}.{cls}", {}).items():
            merged[name] = merged.get(name, set()) | params
    return merged


def _public(dotted: str) -> bool:
    return not any(part.startswith("_") for part in dotted.split("."))


def added(old_root: Path, new_root: Path, package: str) -> dict[str, object]:
    old, old_methods = read_surface(old_root, package)
    new, new_methods = read_surface(new_root, package)
    names: dict[str, list[str]] = {}
    kwargs: dict[str, list[str]] = {}
    for module, defined in new.items():
        if module not in old or not _public(module):
            continue  # a whole new module fails at its import; private ones are not API
        fresh = sorted(n for n in set(defined) - set(old[module]) if _public(n))
        if fresh:
            names[module] = fresh
        for name, params in defined.items():
            before = old[module].get(name)
            if _public(name) and params and before is not None and params - before:
                kwargs[f"{module}.{name}"] = sorted(params - before)
    old_tensor = tensor_methods(old_methods, package)
    new_tensor = tensor_methods(new_methods, package)
    tensor_kwargs = {
        name: sorted(params - old_tensor[name])
        for name, params in new_tensor.items()
        if name in old_tensor and params - old_tensor[name]
    }
    return {
        "package": package,
        "names": names,
        "kwargs": kwargs,
        "tensor_methods": sorted(set(new_tensor) - set(old_tensor)),
        "tensor_kwargs": tensor_kwargs,
    }


def main() -> None:
    old_root, new_root, package = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    version = {}
    for key, root in (("from", old_root), ("to", new_root)):
        files = [root / package / "version.py", root / package / "__init__.py"]
        text = "".join(f.read_text() for f in files if f.is_file())
        found = re.search(r"^__version__ = ['\"]([^'\"+]+)", text, re.M)
        assert found, f"no __version__ in {package}/version.py or __init__.py under {root}"
        version[key] = found.group(1)
    print(json.dumps({**version, **added(old_root, new_root, package)}, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
