"""Runs inside the sandbox (passed to ``python -c``): limits, then the user's code.

``argv[1]`` is a JSON object ``{"RLIMIT_CPU": [soft, hard], ...}``; the code
comes on stdin. Resource limits are lowered before the code runs and cannot be
raised again by it (it holds no capabilities). As in a notebook cell, when the
last statement is an expression its ``repr`` is printed. Tracebacks show the
user's lines only, under the file name ``<code>``.

Standard library only: it runs under whatever interpreter the sandbox uses.
"""

import ast
import json
import linecache
import os
import resource
import sys
import traceback

FILENAME = "<code>"


def main() -> None:
    """Apply the limits from ``argv[1]``, then run the code read from stdin."""
    for name, (soft, hard) in json.loads(sys.argv[1]).items():
        resource.setrlimit(getattr(resource, name), (soft, hard))
    source = sys.stdin.read()
    sys.stdin.close()
    sys.stdin = open(os.devnull)  # noqa: SIM115 - lives as long as the process
    sys.argv = [""]
    linecache.cache[FILENAME] = (len(source), None, source.splitlines(True), FILENAME)
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        tree = ast.parse(source, FILENAME)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, FILENAME, "exec"), namespace)
        if last is not None:
            value = eval(compile(ast.Expression(last.value), FILENAME, "eval"), namespace)
            if value is not None:
                print(repr(value))
    except SystemExit:
        raise
    except BaseException as exc:
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != FILENAME:
            tb = tb.tb_next
        traceback.print_exception(type(exc), exc, tb)
        sys.exit(1)


if __name__ == "__main__":
    main()
