#!/usr/bin/env python3
"""Report import circles between the modules (files) of a Rust crate.

Usage: scripts/import-graph.py [CRATE_SRC_DIR ...]   (default: every crates/*/src)

Each .rs file is a module. An edge A -> B means A names an item of B through a
`use` or a `crate::`/`super::`/`self::` path. A parent naming its own
descendants (declaring, re-exporting, constructing them) is not an edge: that
is the module tree. Test modules (`tests.rs`, `tests/`, `#[cfg(test)] mod tests { }`
blocks) are left out: a test of a module is expected to use it and its parent.

Prints every strongly connected component with more than one module and exits
1 if there is any, so the layout stays a tree of layers: lower modules never
reach back into the ones built on them.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def module_files(src):
    """Map module path (tuple) -> file path for one crate."""
    modules = {}
    for dirpath, _, files in os.walk(src):
        for name in files:
            if not name.endswith(".rs"):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, src)[:-3].split(os.sep)
            if rel in (["lib"], ["main"]):
                mod = ()
            elif rel[-1] == "mod":
                mod = tuple(rel[:-1])
            else:
                mod = tuple(rel)
            if "tests" in mod:
                continue
            modules[mod] = path
    return modules


def strip_tests_and_comments(text):
    text = re.sub(r"//[^\n]*", "", text)
    # Drop `#[cfg(test)] mod NAME { ... }` blocks by brace matching.
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(pub\s+)?mod\s+\w+\s*\{", text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()])
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j
    out.append(text[i:])
    return "".join(out)


def expand_use_tree(tree):
    """'a::{b, c::{d, e}}' -> ['a::b', 'a::c::d', 'a::c::e']"""
    tree = re.sub(r"\s+", "", tree)
    brace = tree.find("{")
    if brace < 0:
        return [re.sub(r"as\w+$", "", tree)]
    prefix = tree[:brace]
    inner = tree[brace + 1:tree.rfind("}")]
    parts, depth, start = [], 0, 0
    for k, ch in enumerate(inner):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(inner[start:k])
            start = k + 1
    parts.append(inner[start:])
    paths = []
    for part in parts:
        if part:
            paths += [prefix + p for p in expand_use_tree(part)]
    return paths


def resolve(mod, segments, modules):
    """Longest module prefix named by a path written in module `mod`."""
    if not segments:
        return None
    head, rest = segments[0], segments[1:]
    if head == "crate":
        base = ()
    elif head == "super":
        base = mod[:-1]
        while rest and rest[0] == "super":
            base, rest = base[:-1], rest[1:]
    elif head == "self":
        base = mod
    elif mod + (head,) in modules:
        base, rest = mod + (head,), rest
    else:
        return None
    target = base
    for seg in rest:
        if target + (seg,) in modules:
            target = target + (seg,)
        else:
            break
    return target


def edges_of(mod, path, modules):
    text = strip_tests_and_comments(open(path).read())
    found = set()
    for m in re.finditer(r"\buse\s+([^;]+);", text):
        for p in expand_use_tree(m.group(1)):
            target = resolve(mod, [s for s in p.split("::") if s], modules)
            if target is not None:
                found.add(target)
    for m in re.finditer(r"\b((?:crate|super|self)(?:::\w+)+)", text):
        target = resolve(mod, m.group(1).split("::"), modules)
        if target is not None:
            found.add(target)
    # A parent names its own children to declare and re-export them: that is
    # the module tree, not an import. Everything else counts, a child's use of
    # what its parent declares included.
    return {t for t in found if t[:len(mod)] != mod}


def strongly_connected(graph):
    index, low, stack, on_stack, result = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            result.append(comp)

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return result


def sibling_graphs(graph):
    """For each parent, its children as units: Ci -> Cj when anything inside
    Ci's subtree names anything inside Cj's. A circle here is a circle between
    two parts of the design even if no two single files close it."""
    parents = {}
    for mod in graph:
        for depth in range(len(mod)):
            parents.setdefault(mod[:depth], set()).add(mod[:depth + 1])
    for parent, children in sorted(parents.items()):
        unit = {}
        for mod, targets in graph.items():
            if mod[:len(parent)] != parent or len(mod) <= len(parent):
                continue
            a = mod[:len(parent) + 1]
            for t in targets:
                if t[:len(parent)] == parent and len(t) > len(parent):
                    b = t[:len(parent) + 1]
                    if a != b:
                        unit.setdefault(a, set()).add(b)
        for child in children:
            unit.setdefault(child, set())
        yield parent, unit


def report(src, kind, graph):
    circles = 0
    for comp in strongly_connected(graph):
        if len(comp) < 2:
            continue
        circles += 1
        names = sorted("::".join(c) or "(root)" for c in comp)
        print(f"{os.path.relpath(src, ROOT)}: import circle among {len(comp)} {kind}:")
        for name in names:
            mod = tuple(name.split("::")) if name != "(root)" else ()
            uses = sorted("::".join(t) or "(root)" for t in graph[mod] if t in comp)
            print(f"  {name} -> {', '.join(uses)}")
    return circles


def main():
    srcs = sys.argv[1:] or [os.path.join(ROOT, "crates", c, "src")
                            for c in sorted(os.listdir(os.path.join(ROOT, "crates")))]
    circles = 0
    for src in srcs:
        modules = module_files(src)
        graph = {m: edges_of(m, p, modules) for m, p in modules.items()}
        circles += report(src, "files", graph)
        for _, unit in sibling_graphs(graph):
            circles += report(src, "sibling modules (with what they contain)", unit)
    if circles:
        sys.exit(1)
    print("no import circles")


if __name__ == "__main__":
    main()
