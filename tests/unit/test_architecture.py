"""The shape of the package: no import cycle anywhere in ``src/vflink``.

Lazy imports inside functions and ``TYPE_CHECKING`` imports count: following a call must never
lead back into a module it left (docs/architecture.md).
"""

from __future__ import annotations

import grimp


def _cycles(graph: grimp.ImportGraph, modules: set[str]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(modules):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = []
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        work.append((root, sorted(graph.find_modules_directly_imported_by(root) & modules)))
        while work:
            node, children = work[-1]
            if children:
                child = children.pop()
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, sorted(graph.find_modules_directly_imported_by(child)
                                               & modules)))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_cycle_finder_finds_a_planted_cycle() -> None:
    graph = grimp.ImportGraph()
    for name in ("p.a", "p.b", "p.c", "p.d"):
        graph.add_module(name)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.c")
    graph.add_import(importer="p.c", imported="p.a")
    graph.add_import(importer="p.c", imported="p.d")
    assert _cycles(graph, set(graph.modules)) == [["p.a", "p.b", "p.c"]]


def test_no_import_cycle_in_src() -> None:
    graph = grimp.build_graph("vflink")
    cycles = _cycles(graph, set(graph.modules))
    assert not cycles, f"import cycles in src/vflink: {cycles}"
