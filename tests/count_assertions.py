"""Count the suite's assertions (by ast, not by running it), so that a change to the tests can
show that none was lost: `python tests/count_assertions.py [--per-file]`.

Counted: `assert` statements, `pytest.raises` / `pytest.warns` uses, and calls of assertion
helpers (`torch.testing.assert_close`, `np.testing.assert_*`, the tests' own `assert_*`
functions). A merged test keeps the count; a deleted assertion lowers it.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _called_name(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


def _is_pytest_attr(call: ast.Call, names: tuple[str, ...]) -> bool:
    func = call.func
    return (
        isinstance(func, ast.Attribute)
        and func.attr in names
        and isinstance(func.value, ast.Name)
        and func.value.id == "pytest"
    )


def count(path: Path) -> Counter:
    tree = ast.parse(path.read_text(), str(path))
    found: Counter = Counter()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            found["assert"] += 1
        elif isinstance(node, ast.Call):
            if _is_pytest_attr(node, ("raises",)):
                found["pytest.raises"] += 1
            elif _is_pytest_attr(node, ("warns",)):
                found["pytest.warns"] += 1
            elif _called_name(node).startswith("assert_"):
                found["assert_*()"] += 1
    return found


def count_all(root: Path = TESTS) -> dict[str, Counter]:
    return {str(p.relative_to(root)): count(p) for p in sorted(root.rglob("*.py"))}


def main(argv: list[str]) -> int:
    per_file = count_all()
    total: Counter = Counter()
    for name, found in per_file.items():
        total.update(found)
        if "--per-file" in argv and found:
            print(f"{name}: {dict(found)}")
    kinds = ("assert", "pytest.raises", "pytest.warns", "assert_*()")
    print(", ".join(f"{k}: {total[k]}" for k in kinds) + f"; total: {sum(total.values())}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
