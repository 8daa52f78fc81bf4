"""docs/errors.md, the ApiError classes and the source agree: one class per code, one place.

The page is the contract a client codes against; the classes are what answers. Reading the
source (not importing a list of modules) finds every class that declares a `code`, so a new
one cannot hide, and a code string written anywhere but its class is a second place that
could answer it: the scan refuses it.
"""

import ast
import importlib
import re
from pathlib import Path

from inference.errors import ENGINE_ERRORS
from platform_site import error_responses, error_translations
from platform_site.errors import ApiError
from tenants.authentication import TRANSLATIONS as AUTHENTICATION_TRANSLATIONS

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("platform_site", "registry", "tenants", "inference", "web")
DOC_ROW = re.compile(r"^\| `([a-z_]+)` \| (\d{3}) \| .+ \| `([\w.]+)` \|$")


def documented() -> dict[str, tuple[int, str]]:
    """code -> (status, dotted class) from the tables of docs/errors.md."""
    rows: dict[str, tuple[int, str]] = {}
    for line in (ROOT / "docs" / "errors.md").read_text().splitlines():
        if match := DOC_ROW.match(line):
            assert match[1] not in rows, f"{match[1]} is documented twice"
            rows[match[1]] = (int(match[2]), match[3])
    return rows


def source_files() -> list[Path]:
    return [
        path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if "migrations" not in path.parts
    ]


def _declarations(tree: ast.AST):
    """(class node, the code's string node) for every class that declares a code, either way:
    `class X(Base, code="x")` or `code = "x"` in its body."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        values: list[ast.expr | None] = [kw.value for kw in node.keywords if kw.arg == "code"]
        for stmt in node.body:
            target = (
                stmt.targets[0] if isinstance(stmt, ast.Assign) else getattr(stmt, "target", None)
            )
            if isinstance(target, ast.Name) and target.id == "code":
                values.append(getattr(stmt, "value", None))
        for value in values:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                yield node, value


def declared_codes() -> dict[str, list[str]]:
    """code -> every dotted class whose body declares it."""
    owners: dict[str, list[str]] = {}
    for path in source_files():
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for cls, value in _declarations(ast.parse(path.read_text())):
            owners.setdefault(value.value, []).append(f"{module}.{cls.name}")
    return owners


def stray_codes(tree: ast.AST, codes: set[str], api_error_names: set[str]) -> list[int]:
    """Lines where a code is written outside its class's declaration, or a raise site picks
    an ApiError's code by hand (`code=` with a literal)."""
    declared = {id(value) for _, value in _declarations(tree)}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in codes and id(node) not in declared:
            lines.append(node.lineno)
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) in api_error_names
        ):
            lines += [
                kw.value.lineno
                for kw in node.keywords
                if kw.arg == "code" and isinstance(kw.value, ast.Constant)
            ]
    return sorted(set(lines))


def _class(dotted: str) -> type:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_the_page_lists_the_codes():
    assert len(documented()) >= 40  # the parser reads the tables, not an empty page


def test_each_code_is_declared_by_exactly_one_class():
    shared = {code: owners for code, owners in declared_codes().items() if len(owners) > 1}
    assert not shared, f"codes declared by several classes: {shared}"


def test_every_declared_code_is_documented_with_its_class_and_status():
    docs = documented()
    for code, (owner,) in declared_codes().items():
        assert code in docs, f"{owner} answers '{code}', which docs/errors.md does not list"
        status, dotted = docs[code]
        assert dotted == owner, f"docs/errors.md says {dotted} answers '{code}'; it is {owner}"
        cls = _class(owner)
        assert issubclass(cls, ApiError) and cls.code == code, owner
        assert cls.status == status, f"{owner} answers {cls.status}; the page says {status}"


def test_every_documented_code_has_its_class():
    declared = declared_codes()
    missing = sorted(set(documented()) - set(declared))
    assert not missing, f"documented but answered by no class: {missing}"


def test_the_engine_and_framework_tables_answer_with_documented_classes():
    docs = documented()
    tables = [error_responses.FRAMEWORK_TRANSLATIONS, error_translations.REGISTERED]
    targets = [t.api_error for table in tables for t in table.values()]
    for cls in targets:
        assert issubclass(cls, ApiError) and cls.code in docs, cls


def test_each_app_registers_its_translations_when_django_starts():
    """The serving layer answers for the engine's refusals, tenants for DRF's
    authentication failures: none is left to the 500 an unknown exception gets."""
    registered = error_translations.REGISTERED
    assert set(ENGINE_ERRORS) <= set(registered)
    assert set(AUTHENTICATION_TRANSLATIONS) <= set(registered)


def _subclasses(cls: type) -> set[type]:
    return {cls}.union(*(_subclasses(sub) for sub in cls.__subclasses__()))


def test_no_code_is_written_outside_its_class():
    codes = set(documented())
    for owners in declared_codes().values():
        for owner in owners:
            _class(owner)  # imported, so that __subclasses__ sees them and their bases
    names = {cls.__name__ for cls in _subclasses(ApiError)}
    assert {"RegistryError", "ProtocolError", "KeyRejected"} <= names
    strays = []
    for path in source_files():
        for line in stray_codes(ast.parse(path.read_text()), codes, names):
            strays.append(f"{path.relative_to(ROOT)}:{line}")
    assert not strays, f"raise the code's class instead of writing its code: {strays}"


def test_the_scan_catches_a_code_written_by_hand():
    codes, names = {"adapter_exists", "no_tenant"}, {"Conflict", "RegistryError"}
    source = """
class AdapterExists(Conflict, status=409, code="adapter_exists"):
    pass

class NoTenant(Conflict):
    code = "no_tenant"

def create():
    raise Conflict("exists", code="adapter_exists")

def check(rejected):
    return rejected.code == "no_tenant"

def other():
    raise RegistryError("x", code="something_new")
"""
    assert stray_codes(ast.parse(source), codes, names) == [9, 12, 15]
