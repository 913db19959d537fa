"""The operator package's rooms and the one direction of imports between them (strata_operator/__init__.py).

Read from the source with `ast`, so an import against the direction fails here before it can grow into a
cycle: controllers -> engine -> sources -> services -> api, decisions -> api.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "operator" / "strata_operator"
# What each room may import of the package besides itself.
MAY_IMPORT = {
    "api": set(),
    "decisions": {"api"},
    "services": {"api"},
    "sources": {"services", "api"},
    "engine": {"sources", "decisions", "services", "api"},
    "controllers": {"engine", "sources", "decisions", "services", "api"},
}


def modules() -> dict[str, Path]:
    """Dotted name under strata_operator (a package as its own name) -> file."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported(name: str, path: Path) -> set[str]:
    """The package's modules (dotted, under strata_operator) that a module imports, wherever in it."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.split(".")[0] == "strata_operator":
                module = node.module.removeprefix("strata_operator").lstrip(".")
            else:
                continue
            # `from .x import y` may import the module x.y: count the deepest module named.
            for alias in node.names:
                deeper = f"{module}.{alias.name}" if module else alias.name
                targets.add(deeper if deeper.replace(".", "/") in _FILES else module)
        elif isinstance(node, ast.Import):
            targets |= {a.name.removeprefix("strata_operator.") for a in node.names
                        if a.name.startswith("strata_operator.")}
    return targets


_FILES = {name.replace(".", "/") for name in modules()}


def room(module: str) -> str:
    return module.split(".")[0]


def test_every_module_lives_in_a_room_and_every_room_says_what_it_holds():
    loose = [name for name, path in modules().items() if "." not in name and path.name != "__init__.py"
             and name not in ("main", "__main__", "")]
    assert loose == [], f"modules outside the rooms {sorted(MAY_IMPORT)}: {loose}"
    for name in MAY_IMPORT:
        doc = ast.get_docstring(ast.parse((PACKAGE / name / "__init__.py").read_text()))
        assert doc and "import" in doc.lower(), f"{name}/__init__.py must say what lives there and what it may import"


def test_imports_go_one_way():
    against = []
    for name, path in modules().items():
        if room(name) not in MAY_IMPORT:
            continue  # main.py and the package's own __init__/__main__: the top
        for target in sorted(imported(name, path)):
            if room(target) != room(name) and room(target) not in MAY_IMPORT[room(name)]:
                against.append(f"{path.relative_to(PACKAGE)} imports {target} ({room(name)} may import only "
                               f"{', '.join(sorted(MAY_IMPORT[room(name)])) or 'nothing of the package'})")
    assert against == []


def test_no_two_modules_differ_only_by_an_s():
    names = {name.rsplit(".", 1)[-1] for name in modules()}
    assert sorted(n for n in names if n + "s" in names) == []


def test_the_checker_sees_an_import_against_the_direction(tmp_path):
    # Without this, a checker that found no imports at all would pass every module.
    source = tmp_path / "mod.py"
    source.write_text("from ..controllers.stack import reconcile_stack\nfrom . import status\n")
    assert imported("api.mod", source) == {"controllers.stack", "api.status"}
