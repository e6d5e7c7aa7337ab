"""The API reference (docs/api.md) covers the public API, and every parameter it shows is
explained.

The public names: everything ``abs_engine`` and ``operators`` export (``__all__``), and
what each module docs/api.md names (``automodule``, or the module of an ``autoclass`` /
``autofunction`` target) exports: its ``__all__`` if it has one, else the classes and
functions whose ``__module__`` it is (re-imports left out). A module's ``__all__`` is how
it says that a class it defines is the engine's, not the user's. Plain constants of those
modules are left out; the packages' own are not (a ``#:`` comment is their docstring).

Checked here: each public name has a docstring of its own (not inherited, not empty, not
the signature a dataclass writes) and an entry in the built reference (its ``objects.inv``,
under the name it is exported as or the one it is defined as); every member a ``:members:``
list of api.md names is in the reference (autodoc silently drops a member that has no
docstring); and every parameter of a function, method or constructor the reference shows
is named in the docstring shown for it.

The convention for a parameter: its name opens a literal in double backquotes,
``name``, ``name=...`` or ``name(...)``. A constructor's parameters are named in the class
docstring or its ``__init__``'s (docs/conf.py shows both); a dataclass field with a
``#:`` comment is documented by that comment. Left out: ``self``, ``cls`` and
``*args``/``**kwargs`` (passed through), and enum classes (their members are documented).
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

import pytest
from sphinx.pycode import ModuleAnalyzer
from sphinx.util.inventory import InventoryFile

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PACKAGES = ("abs_engine", "operators")
DIRECTIVE = re.compile(r"^\.\. auto(module|class|exception|function|data)::\s*(\S+)\s*$")


@dataclasses.dataclass
class Directive:
    """One autodoc directive of docs/api.md: its kind, its target, its ``:members:`` list
    (None: no list; ``[]``: ``:members:`` with no names, every documented member)."""

    kind: str
    target: str
    members: list[str] | None = None


def api_directives() -> list[Directive]:
    """The autodoc directives of docs/api.md, in order, with their ``:members:`` lists
    (a list may go on over more indented lines)."""
    out: list[Directive] = []
    option = ""
    for line in (DOCS / "api.md").read_text().splitlines():
        m = DIRECTIVE.match(line)
        if m:
            out.append(Directive(m.group(1), m.group(2)))
            option = ""
        elif out and line.startswith("   ") and line.strip():
            text = line.strip()
            if text.startswith(":"):
                option, _, text = text[1:].partition(":")
            if option == "members":
                names = [n.strip() for n in text.split(",") if n.strip()]
                out[-1].members = (out[-1].members or []) + names
        elif not line.strip():
            option = ""
    return out


def module_of(target: str) -> str:
    """The longest importable module prefix of a dotted target (``operators.spark.SparkSource``
    -> ``operators.spark``)."""
    parts = target.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        try:
            importlib.import_module(name)
        except ImportError:
            continue
        return name
    raise AssertionError(f"docs/api.md names {target!r}, which is in no importable module")


def resolve(target: str) -> Any:
    """The object a dotted name stands for (a module's attribute, a class's member)."""
    module = module_of(target)
    obj: Any = importlib.import_module(module)
    for part in target[len(module) + 1:].split(".") if target != module else []:
        obj = inspect.getattr_static(obj, part) if inspect.isclass(obj) else getattr(obj, part)
        if isinstance(obj, (classmethod, staticmethod)):
            obj = obj.__func__
    return obj


def reference_modules() -> list[str]:
    """The modules docs/api.md names, the packages first."""
    named = [module_of(d.target) if d.kind != "module" else d.target for d in api_directives()]
    return list(dict.fromkeys([*PACKAGES, *named]))


def is_constant(obj: Any) -> bool:
    return not (inspect.isclass(obj) or inspect.isfunction(obj))


def public_names() -> Iterator[tuple[str, str, Any]]:
    """``(module, name, object)`` for every public name (see the module docstring)."""
    for module_name in reference_modules():
        module = importlib.import_module(module_name)
        exported = getattr(module, "__all__", None)
        if exported is None:
            exported = [n for n, o in vars(module).items() if not n.startswith("_") and not is_constant(o)
                        and o.__module__ == module_name]
        for name in exported:
            obj = getattr(module, name)
            if module_name in PACKAGES or not is_constant(obj):
                yield module_name, name, obj


def defining_modules(name: str, obj: Any) -> list[str]:
    """The modules of abs_engine and operators that bind ``name`` to ``obj`` with a ``#:``
    comment: where a constant is documented."""
    out = []
    for module_name, module in sorted(sys.modules.items()):
        if (module_name.partition(".")[0] in PACKAGES and isinstance(module, ModuleType)
                and vars(module).get(name, None) is obj
                and ("", name) in ModuleAnalyzer.for_module(module_name).find_attr_docs()):
            out.append(module_name)
    return out


def own_docstring(obj: Any) -> str:
    """The docstring ``obj`` itself has: '' for none, an inherited one, or the signature a
    dataclass writes when the class has none."""
    if inspect.isclass(obj):
        doc = obj.__dict__.get("__doc__") or ""
        if dataclasses.is_dataclass(obj) and doc.startswith(obj.__name__ + "("):
            return ""
        return doc.strip()
    return (obj.__doc__ or "").strip()


def names_parameter(doc: str, name: str) -> bool:
    """The convention: ``name``, ``name=...`` or ``name(...)`` (a literal opened by it)."""
    return re.search(r"``" + re.escape(name) + r"(``|[^A-Za-z0-9_`][^`]*``)", doc) is not None


def field_comments(cls: type) -> set[str]:
    """The fields of dataclass ``cls`` (and of its bases) that have a ``#:`` comment."""
    out: set[str] = set()
    for klass in cls.__mro__:
        if dataclasses.is_dataclass(klass) and klass.__module__.partition(".")[0] in PACKAGES:
            docs = ModuleAnalyzer.for_module(klass.__module__).find_attr_docs()
            out |= {attr for (qualname, attr) in docs if qualname == klass.__qualname__}
    return out


def parameters(obj: Any) -> list[str]:
    """The parameters of a function or constructor a docstring must name."""
    skip = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    try:
        signature = inspect.signature(obj)
    except ValueError:  # an exception class without an __init__ of its own: BaseException's
        return []
    return [p.name for p in signature.parameters.values() if p.kind not in skip and p.name not in ("self", "cls")]


@pytest.fixture(scope="module")
def inventory(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    """The built reference's objects, by role (``py:class``: its dotted names): the docs
    built once for this module, warnings as errors."""
    out = tmp_path_factory.mktemp("reference") / "html"
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-E", "-W", "--keep-going", "-q", "-b", "html",
                           str(DOCS), str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(out / "objects.inv", "rb") as f:
        loaded = InventoryFile.load(f, "", lambda base, uri: uri)
    return {role: set(entries) for role, entries in loaded.items() if role.startswith("py:")}


def everything(inventory: dict[str, set[str]]) -> set[str]:
    """Every dotted name the reference documents, whatever its role."""
    return set().union(*inventory.values())


def test_every_public_name_has_a_docstring_of_its_own() -> None:
    missing = []
    for module, name, obj in public_names():
        documented = bool(defining_modules(name, obj)) if is_constant(obj) else bool(own_docstring(obj))
        if not documented:
            missing.append(f"{module}.{name}")
    assert not missing, f"public names without a docstring of their own (a #: comment for a constant): {missing}"


def test_every_public_name_is_in_the_reference(inventory: dict[str, set[str]]) -> None:
    known = everything(inventory)
    names = list(public_names())
    # Every name an object is exported as: the reference may show it under any of them.
    exported: dict[int, set[str]] = {}
    for module, name, obj in names:
        exported.setdefault(id(obj), set()).add(f"{module}.{name}")
    missing = []
    for module, name, obj in names:
        candidates = set(exported[id(obj)])
        if is_constant(obj):
            candidates |= {f"{m}.{name}" for m in defining_modules(name, obj)}
        else:
            candidates.add(f"{obj.__module__}.{obj.__qualname__}")
        if not candidates & known:
            missing.append(f"{module}.{name}")
    assert not missing, f"public names missing from the built reference (add them to docs/api.md): {missing}"


def test_every_member_api_md_lists_is_in_the_reference(inventory: dict[str, set[str]]) -> None:
    known = everything(inventory)
    missing = [f"{d.target}.{member}" for d in api_directives() for member in d.members or []
               if f"{d.target}.{member}" not in known]
    assert not missing, f"members docs/api.md lists that the built reference dropped (no docstring?): {missing}"


def test_every_parameter_the_reference_shows_is_documented(inventory: dict[str, set[str]]) -> None:
    seen: set[int] = set()
    missing = []
    for role in ("py:function", "py:method", "py:class", "py:exception"):
        for target in sorted(inventory.get(role, ())):
            obj = resolve(target)
            if id(obj) in seen or (inspect.isclass(obj) and issubclass(obj, enum.Enum)):
                continue
            seen.add(id(obj))
            if inspect.isclass(obj):
                doc = (obj.__doc__ or "") + "\n" + (obj.__init__.__doc__ or "")
                undocumented = [p for p in parameters(obj) if not names_parameter(doc, p)
                                and p not in field_comments(obj)]
            else:
                undocumented = [p for p in parameters(obj) if not names_parameter(inspect.getdoc(obj) or "", p)]
            missing += [f"{target}({p})" for p in undocumented]
    assert not missing, ("parameters the reference shows that their docstring does not name (as ``name``): "
                         f"{missing}")


def test_the_operator_interface_is_in_the_reference_whole(inventory: dict[str, set[str]]) -> None:
    """Every public method a class of operators/base.py (the interface a connector or an
    operator of one's own implements, docs/writing-connectors.md) defines is in the
    reference: a hook left out is one nobody knows to implement."""
    import operators.base as base

    known = everything(inventory)
    missing = []
    for name, cls in vars(base).items():
        if not inspect.isclass(cls) or cls.__module__ != base.__name__ or name.startswith("_"):
            continue
        for member, value in vars(cls).items():
            if member.startswith("_") or not (inspect.isfunction(value) or isinstance(value, property)):
                continue
            shown = {f"{m}.{cls.__qualname__}.{member}" for m in ("operators", "operators.base")}
            if not shown & known and not any(member in vars(b) for b in cls.__mro__[1:]):
                missing.append(f"{cls.__qualname__}.{member}")
    assert not missing, f"interface methods missing from the reference (add them to a :members: list): {missing}"
