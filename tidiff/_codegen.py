"""Turn generated source text into live Python/Taichi objects.

Taichi reads a function's source with ``inspect``; source made at run time
is found there only if it is registered in ``linecache`` under a file name of
its own, which is what :func:`compile_source` does.
"""
import itertools
import linecache

_counter = itertools.count()


def compile_source(source, name, namespace, tag="gen"):
    """Execute ``source`` in ``namespace`` and return the object it defines as ``name``.

    The source is registered in ``linecache`` so that Taichi (and tracebacks)
    can read it back; the file name says which generator made it.
    """
    filename = f"<tidiff-{tag}-{next(_counter)}:{name}>"
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)
    exec(compile(source, filename, "exec"), namespace)
    obj = namespace[name]
    obj._tidiff_source = source  # for td.source
    return obj
