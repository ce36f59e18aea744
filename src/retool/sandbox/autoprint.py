"""The reference's auto-print, done on the AST.

If the last statement of a snippet is a bare expression (``2**100``), its value
is printed, like a notebook cell; ``x = 1``, ``for`` blocks and ``print(...)``
itself are left alone, and a ``None`` value prints nothing.
"""

from __future__ import annotations

import ast


def add_autoprint(code: str) -> ast.Module | str:
    """A module whose last bare expression is printed; the code if it does not parse."""
    try:
        tree = ast.parse(code, mode="exec")
    except Exception:  # SyntaxError, NUL bytes, nesting too deep, unencodable text
        return code  # compile() raises the same error, reported as the code's own
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return tree
    last = tree.body[-1]
    value = last.value
    if (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id == "print"
    ):
        return tree
    name = "__retool_last_value__"
    assign = ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())], value=value)
    show = ast.If(
        test=ast.Compare(
            left=ast.Name(id=name, ctx=ast.Load()),
            ops=[ast.IsNot()],
            comparators=[ast.Constant(value=None)],
        ),
        body=[
            ast.Expr(
                ast.Call(
                    func=ast.Name(id="print", ctx=ast.Load()),
                    args=[ast.Name(id=name, ctx=ast.Load())],
                    keywords=[],
                )
            )
        ],
        orelse=[],
    )
    tree.body[-1:] = [assign, show]
    return ast.fix_missing_locations(ast.copy_location(tree, tree))
