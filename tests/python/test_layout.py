"""The shape of the source tree: the Python package's imports run one way, and no source file is too long.

The package rules are read from the source with `ast` (nothing is imported):
(a) no cycle among the modules' module-level imports of each other;
(b) no import of a package module inside a function or class body (the
    usual way to hide a cycle);
(c) no module uses another package module's underscore name
    (`from .x import _y`, `x._y`); a leading-underscore *module* (`_core`,
    `_loop`) may be imported, and so may its public names.
Each finding names file:line. The checker itself is also run on small
made-up packages that break each rule, so a rule that stops catching
anything goes red here.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pyhost" / "cadeloop"
PACKAGE_NAME = "cadeloop"

#: Folders whose source files must stay within MAX_LINES (CONVENTIONS.md: one responsibility per file).
SIZED_FOLDERS = ("http", "net", "runtime", "pyhost", "config")
SIZED_SUFFIXES = (".cpp", ".hpp", ".h", ".py")
MAX_LINES = 1000


# --------------------------------------------------------------------------- reading the package


@dataclass
class ModuleImports:
    """What one module of the package imports of the package, and where."""

    name: str
    path: Path
    # (module imported, line) for imports that run when the module is imported.
    top_level: list[tuple[str, int]] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_names(package: Path) -> set[str]:
    """The package's modules: its .py files, and the compiled ones its .pyi stubs describe (`_core`)."""
    return {p.stem for p in package.glob("*.py")} | {p.stem for p in package.glob("*.pyi")}


class _Reader(ast.NodeVisitor):
    """Walks one module: records its package imports, flags local imports and private names."""

    def __init__(self, info: ModuleImports, modules: set[str], package_name: str) -> None:
        self.info = info
        self.modules = modules
        self.package_name = package_name
        self.depth = 0  # > 0 inside a function or class body
        self.type_checking = 0  # > 0 inside `if TYPE_CHECKING:` (never runs)
        # Local name -> package module it is bound to ("" is the package itself).
        self.bound: dict[str, str] = {}

    def where(self, node: ast.AST) -> str:
        path = self.info.path
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        return f"{shown}:{getattr(node, 'lineno', 0)}"

    # --- which package modules an import statement names
    def _targets_of_from(self, node: ast.ImportFrom) -> list[tuple[str, str | None]]:
        """(module, attribute or None) for each name of `from X import a, b`; [] if X is outside the package."""
        if node.level > 1:
            return []  # no sub-packages: this leaves the package
        if node.level == 1:
            base = node.module or ""
        elif node.module == self.package_name:
            base = ""
        elif node.module is not None and node.module.startswith(self.package_name + "."):
            base = node.module[len(self.package_name) + 1:]
        else:
            return []
        if base:
            return [(base.split(".")[0], alias.name) for alias in node.names]
        # `from . import x`: x is a module of the package, or an attribute of __init__.
        return [(alias.name, None) if alias.name in self.modules else ("__init__", alias.name)
                for alias in node.names]

    def _record(self, node: ast.AST, module: str) -> None:
        if module == self.info.name:
            return
        if self.depth:
            self.info.findings.append(
                f"{self.where(node)}: imports package module {module!r} inside a function or class body "
                "(move it to the top of the module; if that makes a cycle, move the shared code down a layer)")
        elif not self.type_checking:
            self.info.top_level.append((module, getattr(node, "lineno", 0)))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        targets = self._targets_of_from(node)
        for module in dict.fromkeys(module for module, _ in targets):
            self._record(node, module)
        for (module, attr), alias in zip(targets, node.names):
            if attr is not None and _is_private(attr) and module != self.info.name:
                self.info.findings.append(
                    f"{self.where(node)}: imports the private name {attr!r} of package module {module!r}")
            if attr is None:
                self.bound[alias.asname or alias.name] = module
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            parts = alias.name.split(".")
            if parts[0] != self.package_name:
                continue
            module = parts[1] if len(parts) > 1 else "__init__"
            self._record(node, module)
            if alias.asname:
                self.bound[alias.asname] = module
            else:
                self.bound[parts[0]] = ""  # `import cadeloop.x` binds `cadeloop`
        self.generic_visit(node)

    # --- `x._y` where x is a package module
    def _module_of(self, node: ast.expr) -> str | None:
        """The package module an expression names (`_core`, `cadeloop._core`), else None."""
        if isinstance(node, ast.Name):
            return self.bound.get(node.id)
        if isinstance(node, ast.Attribute):
            owner = self._module_of(node.value)
            if owner == "" and node.attr in self.modules:
                return node.attr
        return None

    def visit_Attribute(self, node: ast.Attribute) -> None:
        owner = self._module_of(node.value)
        if owner is not None and owner != self.info.name and _is_private(node.attr):
            if not (owner == "" and node.attr in self.modules):  # `cadeloop._core` is a module, not a name
                self.info.findings.append(
                    f"{self.where(node)}: uses the private name {node.attr!r} of package module "
                    f"{owner or '__init__'!r}")
        self.generic_visit(node)

    # --- bodies
    def _body(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = _body

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        guarded = (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
        if not guarded:
            self.generic_visit(node)
            return
        self.visit(node.test)
        self.type_checking += 1
        for child in node.body:
            self.visit(child)
        self.type_checking -= 1
        for child in node.orelse:
            self.visit(child)


def read_package(package: Path, package_name: str = PACKAGE_NAME) -> dict[str, ModuleImports]:
    """Every .py module of `package`, read with ast."""
    modules = _module_names(package)
    result = {}
    for path in sorted(package.glob("*.py")):
        info = ModuleImports(path.stem, path)
        _Reader(info, modules, package_name).visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        result[info.name] = info
    return result


def import_cycles(infos: dict[str, ModuleImports]) -> list[str]:
    """One line per cycle among module-level imports: each edge as "a (file:line) -> b"."""
    edges: dict[str, dict[str, int]] = {}
    for name, info in infos.items():
        for target, line in info.top_level:
            if target in infos:
                edges.setdefault(name, {}).setdefault(target, line)
    cycles: list[str] = []
    seen_sets: set[frozenset[str]] = set()
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, {})):
            if state.get(nxt) == 1:
                loop = stack[stack.index(nxt):]
                if frozenset(loop) not in seen_sets:
                    seen_sets.add(frozenset(loop))
                    hops = [f"{a} ({infos[a].path.name}:{edges[a][b]}) -> {b}"
                            for a, b in zip(loop, loop[1:] + [loop[0]])]
                    cycles.append("import cycle: " + ", ".join(hops))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for name in sorted(infos):
        if name not in state:
            visit(name)
    return cycles


def package_findings(package: Path, package_name: str = PACKAGE_NAME) -> list[str]:
    infos = read_package(package, package_name)
    return import_cycles(infos) + [f for info in infos.values() for f in info.findings]


# --------------------------------------------------------------------------- the package


def test_the_package_is_where_the_tests_look() -> None:
    assert (PACKAGE / "__init__.py").is_file(), f"no package at {PACKAGE}"
    assert len(read_package(PACKAGE)) >= 5


def test_package_imports_run_one_way() -> None:
    findings = package_findings(PACKAGE)
    assert not findings, "the package's imports must run one way:\n" + "\n".join(findings)


# --------------------------------------------------------------------------- the checker catches each rule


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    package = tmp_path / PACKAGE_NAME
    package.mkdir()
    (package / "_core.pyi").write_text("X: int\n_hidden: int\n")
    for name, text in files.items():
        (package / name).write_text(text)
    return package


def test_checker_finds_a_cycle(tmp_path: Path) -> None:
    package = _package(tmp_path, {
        "__init__.py": "from .a import f\n",
        "a.py": "from . import _core\nfrom .b import g\n\ndef f():\n    return g()\n",
        "b.py": "import os\n\nfrom .c import h\n\ndef g():\n    return h()\n",
        "c.py": "from cadeloop import a\n\ndef h():\n    return a\n",
    })
    findings = package_findings(package)
    assert findings == ["import cycle: a (a.py:2) -> b, b (b.py:3) -> c, c (c.py:1) -> a"], findings


def test_checker_finds_a_cycle_through_init(tmp_path: Path) -> None:
    package = _package(tmp_path, {"__init__.py": "from .a import f\n", "a.py": "from . import f as g\nf = 1\n"})
    assert package_findings(package) == ["import cycle: __init__ (__init__.py:1) -> a, a (a.py:1) -> __init__"]


def test_checker_finds_a_function_local_import(tmp_path: Path) -> None:
    package = _package(tmp_path, {
        "__init__.py": "",
        "a.py": "import json\n\ndef f():\n    import os\n    from .b import g\n    return g\n",
        "b.py": "class K:\n    import cadeloop.a as m\n\ng = lambda: __import__('x')\n",
    })
    findings = package_findings(package)
    assert any(f.endswith("a.py:5: imports package module 'b' inside a function or class body "
                          "(move it to the top of the module; if that makes a cycle, move the shared code down a layer)")
               for f in findings), findings
    assert any("b.py:2: imports package module 'a' inside a function or class body" in f for f in findings), findings
    assert len(findings) == 2, findings  # stdlib imports (json, os) are not this rule's business


def test_checker_finds_private_names(tmp_path: Path) -> None:
    package = _package(tmp_path, {
        "__init__.py": "from . import _core\n__version__ = _core.X\n",
        "a.py": "_secret = 1\nopen_ = 2\n",
        "b.py": (
            "from . import _core, a\n"
            "from .a import _secret, open_\n"
            "import cadeloop._core\n"
            "import cadeloop.a as aa\n"
            "x = _core.X + _core.__name__.count('a')\n"
            "y = _core._hidden\n"
            "a._secret = 3\n"
            "z = cadeloop._core._hidden + cadeloop._core.X\n"
            "w = aa._secret\n"
        ),
    })
    findings = sorted(package_findings(package))
    assert findings == sorted([
        f"{package / 'b.py'}:2: imports the private name '_secret' of package module 'a'",
        f"{package / 'b.py'}:6: uses the private name '_hidden' of package module '_core'",
        f"{package / 'b.py'}:7: uses the private name '_secret' of package module 'a'",
        f"{package / 'b.py'}:8: uses the private name '_hidden' of package module '_core'",
        f"{package / 'b.py'}:9: uses the private name '_secret' of package module 'a'",
    ]), findings


def test_checker_accepts_type_checking_imports_and_own_names(tmp_path: Path) -> None:
    package = _package(tmp_path, {
        "__init__.py": "from .a import f\n",
        "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import G\n_own = 1\n"
                "def f() -> 'G':\n    return _own\n",
        "b.py": "from .a import f\nclass G:\n    pass\n",
    })
    assert package_findings(package) == []


# --------------------------------------------------------------------------- file length


def long_source_files(root: Path) -> list[str]:
    """'path: N lines' for each source file under SIZED_FOLDERS with more than MAX_LINES lines."""
    found = []
    for folder in SIZED_FOLDERS:
        for path in sorted((root / folder).rglob("*")):
            rel = path.relative_to(root)
            if path.suffix not in SIZED_SUFFIXES or not path.is_file():
                continue
            if any(part.startswith(".") or part == "__pycache__" for part in rel.parts):
                continue
            with path.open("rb") as f:
                lines = sum(1 for _ in f)
            if lines > MAX_LINES:
                found.append(f"{rel}: {lines} lines")
    return found


def test_the_sized_folders_exist() -> None:
    for folder in SIZED_FOLDERS:
        assert (ROOT / folder).is_dir(), f"no folder {folder}/ under {ROOT}"


def test_no_source_file_passes_a_thousand_lines() -> None:
    found = long_source_files(ROOT)
    assert not found, (f"source files in {'/, '.join(SIZED_FOLDERS)}/ longer than {MAX_LINES} lines "
                       "(split them by responsibility):\n" + "\n".join(found))


@pytest.mark.parametrize("lines, too_long", [(MAX_LINES, False), (MAX_LINES + 1, True)])
def test_length_rule_counts_lines(tmp_path: Path, lines: int, too_long: bool) -> None:
    for folder in SIZED_FOLDERS:
        (tmp_path / folder).mkdir()
    (tmp_path / "runtime" / "big.cpp").write_text("x;\n" * lines)
    (tmp_path / "runtime" / "notes.md").write_text("x\n" * (MAX_LINES + 5))  # not a source file
    expected = [f"{Path('runtime') / 'big.cpp'}: {lines} lines"] if too_long else []
    assert long_source_files(tmp_path) == expected


# ---------------------------------------------------------------- pyhost's two parts

INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)
#: The one header of pyhost/loop/ that anything outside it may include.
LOOP_INTERFACE = "loop/loop_source.hpp"


def asgi_loop_includes(pyhost: Path) -> list[str]:
    """Includes of a pyhost/loop/ header other than its interface, by a file of pyhost/asgi/ (file:line)."""
    found = []
    for path in sorted((pyhost / "asgi").rglob("*")):
        if path.suffix not in (".cpp", ".hpp", ".h"):
            continue
        text = path.read_text(errors="replace")
        for m in INCLUDE.finditer(text):
            target = m.group(1)
            if (target.startswith("loop/") or target.startswith("../loop/")) and target != LOOP_INTERFACE:
                line = text.count("\n", 0, m.start()) + 1
                found.append(f"{path.relative_to(pyhost.parent)}:{line}: includes {target}")
    return found


def test_asgi_reaches_the_loop_only_through_loop_source() -> None:
    found = asgi_loop_includes(ROOT / "pyhost")
    assert not found, f"pyhost/asgi/ may include only {LOOP_INTERFACE} of pyhost/loop/:\n" + "\n".join(found)


def test_include_rule_finds_a_loop_header(tmp_path: Path) -> None:
    (tmp_path / "pyhost" / "asgi").mkdir(parents=True)
    (tmp_path / "pyhost" / "asgi" / "a.cpp").write_text(
        '#include "loop/loop_source.hpp"\n#include "py_exception.hpp"\n  #include "loop/loop_core.hpp"\n')
    assert asgi_loop_includes(tmp_path / "pyhost") == [
        f"{Path('pyhost') / 'asgi' / 'a.cpp'}:3: includes loop/loop_core.hpp"]
