"""The engine, its kernels and the GPU suite use nothing torch or triton added after the
GPU image's releases (torch 2.11, triton 3.6): no such function, module member, tensor
method or keyword argument (api_floor.py made the lists from both releases' sources; the
pinned versions here are newer, so local tests alone would not notice)."""

import ast
import importlib.metadata
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("torch", "triton")
ADDED = {
    package: json.loads(Path(__file__).with_name(f"{package}_api_added.json").read_text())
    for package in PACKAGES
}
CHECKED = [
    *sorted((ROOT / "inference" / "engine").rglob("*.py")),
    *sorted((ROOT / "inference" / "kernels").rglob("*.py")),
    *sorted((ROOT / "bench").glob("gpu_*.py")),
    ROOT / "bench" / "common.py",
]


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


class Uses(ast.NodeVisitor):
    """Every use of a package's added API in one module: names through any import alias
    (`import torch.nn.functional as F`, `from torch import nn`), keyword arguments of calls
    to its functions, and tensor methods (any attribute of that name; for triton, inside
    @jit kernels only, where values are Triton tensors)."""

    def __init__(self, added: dict):
        self.package = added["package"]
        self.in_kernel = False
        self.names: dict[str, set[str]] = {m: set(n) for m, n in added["names"].items()}
        self.kwargs: dict[str, set[str]] = {f: set(k) for f, k in added["kwargs"].items()}
        self.tensor_methods = set(added["tensor_methods"])
        self.tensor_kwargs = {m: set(k) for m, k in added["tensor_kwargs"].items()}
        self.aliases: dict[str, str] = {}
        self.found: list[str] = []

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] == self.package:
                if alias.asname:
                    self.aliases[alias.asname] = alias.name
                else:
                    self.aliases[self.package] = self.package

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if module.split(".")[0] != self.package:
            return
        for alias in node.names:
            self._check_dotted(f"{module}.{alias.name}", node)
            self.aliases[alias.asname or alias.name] = f"{module}.{alias.name}"

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        jit = any("jit" in ast.unparse(d) for d in node.decorator_list)
        outer, self.in_kernel = self.in_kernel, self.in_kernel or jit
        self.generic_visit(node)
        self.in_kernel = outer

    def visit_Attribute(self, node: ast.Attribute) -> None:
        dotted = self._resolve(node)
        if dotted is not None:
            self._check_dotted(dotted, node)
        elif node.attr in self.tensor_methods and self._tensor_values():
            self._flag(node, f"tensor method .{node.attr}")
        self.generic_visit(node)

    def _tensor_values(self) -> bool:
        return self.package != "triton" or self.in_kernel

    def visit_Call(self, node: ast.Call) -> None:
        keywords = {k.arg for k in node.keywords if k.arg is not None}
        if isinstance(node.func, ast.Attribute | ast.Name) and keywords:
            dotted = self._resolve(node.func)
            if dotted is not None:
                for kw in sorted(keywords & self.kwargs.get(dotted, set())):
                    self._flag(node, f"{dotted}({kw}=...)")
            elif isinstance(node.func, ast.Attribute) and self._tensor_values():
                for kw in sorted(keywords & self.tensor_kwargs.get(node.func.attr, set())):
                    self._flag(node, f"tensor method .{node.func.attr}({kw}=...)")
        self.generic_visit(node)

    def _resolve(self, node: ast.expr) -> str | None:
        """`torch.a.b` for a chain rooted at an alias of torch or of one of its members."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id not in self.aliases:
            return None
        return ".".join([self.aliases[node.id], *reversed(parts)])

    def _check_dotted(self, dotted: str, node: ast.AST) -> None:
        parts = dotted.split(".")
        for i in range(1, len(parts)):
            if parts[i] in self.names.get(".".join(parts[:i]), ()):
                self._flag(node, ".".join(parts[: i + 1]))

    def _flag(self, node: ast.AST, what: str) -> None:
        line = f"line {getattr(node, 'lineno', '?')}: {what}"
        if line not in self.found:  # an inner part of a chain is visited again
            self.found.append(line)


def uses_of_added_api(source: str, package: str = "torch") -> list[str]:
    visitor = Uses(ADDED[package])
    visitor.visit(ast.parse(source))
    return visitor.found


@pytest.mark.parametrize("package", PACKAGES)
def test_the_lists_describe_the_installed_versions(package):
    version, added = importlib.metadata.version(package), ADDED[package]
    installed = _minor(version)
    if installed <= _minor(added["from"]):
        pytest.skip(f"{package} {version} is the GPU image's release or older")
    assert installed <= _minor(added["to"]), (
        f"{package} {version} is newer than the {added['to']} that {package}_api_added.json "
        f"was made from: regenerate it (see tests/bench/api_floor.py) so the check covers "
        f"what {version} added"
    )


@pytest.mark.parametrize("package", PACKAGES)
@pytest.mark.parametrize("path", CHECKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_api_newer_than_the_gpu_image(path, package):
    found = uses_of_added_api(path.read_text(), package)
    assert not found, (
        f"{path.relative_to(ROOT)} uses {package} API added after {ADDED[package]['from']} "
        f"(the GPU image's {package}): {found}"
    )


def test_the_check_finds_added_names_through_aliases():
    added = ADDED["torch"]
    module, names = next((m, n) for m, n in added["names"].items() if m.count(".") >= 1)
    short = module.rsplit(".", 1)[1]
    source = (
        f"import {module} as alias\nalias.{names[0]}()\n"
        f"from {module.rsplit('.', 1)[0]} import {short}\n{short}.{names[0]}\n"
        f"from {module} import {names[0]}\n"
    )
    found = uses_of_added_api(source)
    assert len(found) == 3, found
    assert all(f"{module}.{names[0]}" in line for line in found)


def test_the_check_finds_added_keyword_arguments():
    function, kwargs = next(iter(ADDED["torch"]["kwargs"].items()))
    source = f"import torch\n{function}(1, {kwargs[0]}=2)\n"
    assert f"line 2: {function}({kwargs[0]}=...)" in uses_of_added_api(source)


def test_old_api_and_other_packages_pass():
    source = (
        "import torch\nimport torch.nn.functional as F\nfrom torch import nn\n"
        "x = torch.empty(3, device='cpu')\nF.embedding(x, x)\nnn.Module()\n"
        "import numpy as np\nnp.linear_cross_entropy(1, recompile_limit=2)\n"
    )
    assert uses_of_added_api(source) == []


def test_triton_tensor_methods_count_inside_kernels_only():
    method = next(m for m in ADDED["triton"]["tensor_methods"] if not m.startswith("_"))
    source = (
        "import triton\nimport triton.language as tl\n\n"
        f"@triton.jit\ndef kernel(x):\n    return x.{method}()\n\n"
        f"def host(t):\n    return t.{method}()\n"
    )
    assert uses_of_added_api(source, "triton") == [f"line 6: tensor method .{method}"]
    added = next(n for n in ADDED["triton"]["names"]["triton.language"])
    assert uses_of_added_api(f"import triton.language as tl\ntl.{added}(1)\n", "triton") == [
        f"line 2: triton.language.{added}"
    ]
