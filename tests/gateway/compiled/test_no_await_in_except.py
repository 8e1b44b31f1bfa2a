"""No compiled module awaits inside an except block.

A mypyc-compiled coroutine suspended inside an except handler leaves its exception as the thread's current one;
a later bare ``raise`` or a ``finally`` in another coroutine then re-raises that stale error (a worker's call
failed with another test's provider error). Compiled modules take the exception out of the block first."""

import ast
from pathlib import Path

from gateway.compiled import MODULES, PACKAGE_ROOT


def test_no_compiled_module_awaits_inside_an_except_block() -> None:
    found = []
    for name in MODULES:
        path = PACKAGE_ROOT / Path(*name.split(".")).with_suffix(".py")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ExceptHandler):
                found += [
                    f"{path.relative_to(PACKAGE_ROOT)}:{sub.lineno}"
                    for sub in ast.walk(node)
                    if isinstance(sub, ast.Await | ast.AsyncWith | ast.AsyncFor)
                ]
    assert found == [], found
