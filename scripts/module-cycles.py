#!/usr/bin/env python3
"""No import circle between the modules of a crate.

    python3 scripts/module-cycles.py [-v] [--own-items] [CRATE_DIR ...]   (default: crates/*)

Exits 1 and names the modules and the references that make each circle, 0 when there is none.
`-v` lists every reference of an edge, not the first three.

The rule. A crate's module tree (src/lib.rs, src/main.rs and src/bin/*.rs, each a crate root,
and the `mod` declarations from there, inline `mod x { ... }` included) is read level by level.
A reference from module M to an item defined in module T is an edge between the two sibling
subtrees that hold M and T, the children of their lowest common ancestor: `loadgen::plan::x`
using `loadgen::report::Y` is the edge plan -> report. A circle is a strongly connected
component of more than one sibling: `a` uses `b` and `b`, directly or through other siblings,
uses `a`. The fix is to move what both sides use into a module of its own (a leaf of shared
types), below both.

A module and its own descendants make no edge: a child using its parent's items through
`super::` (a type the parent defines, an `impl Parent` split over files) is nesting, and so is
a parent using its children. `--own-items` is stricter and only informs (CI does not run it):
it also counts the edges between a parent's own items (what P.rs or P/mod.rs itself defines)
and its child subtrees, so a parent whose children use its types while it uses theirs shows
as a circle.

What counts as a reference of M (M's own code: not the bodies of its inline child modules):

- a path in code or in attributes: `crate::a::X`, `super::X`, `self::a::X`, `a::X` where `a`
  is a child module of M or a name M imports, and `X` where `X` was imported by a `use` or a
  glob `use ...::*` of a module of the crate;
- a private `use` declaration (`use super::a::X;`): it exists to be used in M. A re-export
  (`pub use`, `pub(crate) use`, ...) is M's face: it makes no edge by itself, but M's code
  using the name does. Glob imports make edges only through the names M's code uses;
- code under `#[cfg(test)]` (a `mod tests` and what it holds) does not count: a test may
  build its inputs from any module of the crate;
- a path that names a module only (`pub(in crate::a)`, `use super::a;`) is no reference;
  re-exports are followed to the module that defines the item.

Names are matched on tokens (comments and literals removed), not resolved by the compiler:
a local binding shadowing an imported name, or a macro's expansion, is not seen. Method calls
(`x.f()`) name no module and make no edge.
"""

import bisect
import os
import re
import sys
from collections import defaultdict

KEYWORDS_ITEM = {"fn", "struct", "enum", "trait", "type", "const", "static", "union"}
TOKEN_RE = re.compile(
    r"""
    (?P<skip>
        \s+
      | //[^\n]*
      | /\*(?:[^*/]|\*(?!/)|/(?!\*)|/\*(?:[^*]|\*(?!/))*\*/)*\*/
      | b?r(?P<hashes>\#*)".*?"(?P=hashes)
      | b?"(?:[^"\\]|\\.)*"
      | b?'(?:[^'\\\n]|\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]{1,6}\}|.))'
      | '[A-Za-z_][A-Za-z0-9_]*
      | [0-9][0-9A-Za-z_.]*
    )
  | (?P<ident>(?:r\#)?[A-Za-z_][A-Za-z0-9_]*)
  | (?P<path_sep>::)
  | (?P<punct>.)
    """,
    re.VERBOSE | re.DOTALL,
)


def tokenize(text):
    """(kind, value, line) for identifiers, `::` and punctuation; comments (block comments
    nested one deep), literals, lifetimes and numbers go."""
    newlines = [i for i, c in enumerate(text) if c == "\n"]
    tokens = []
    for m in TOKEN_RE.finditer(text):
        kind = m.lastgroup
        if kind in ("skip", "hashes"):
            continue
        value = m.group()
        if kind == "ident" and value.startswith("r#"):
            value = value[2:]
        tokens.append((kind, value, bisect.bisect_right(newlines, m.start()) + 1))
    return tokens


class Module:
    def __init__(self, path, file, parent):
        self.path = path  # tuple of names from the crate root
        self.file = file
        self.parent = parent
        self.test = parent is not None and parent.test  # under #[cfg(test)]
        self.children = {}  # name -> Module
        self.items = set()  # names defined at the module's top level
        self.imports = {}  # name -> (relative path segments, line)
        self.globs = []  # relative path segments of `use ...::*`
        self.private_uses = []  # (relative path segments, line)
        self.paths = []  # (path segments, line): paths in the module's code
        self.idents = []  # (name, line): single identifiers in the module's code

    def name(self):
        return "::".join(("crate",) + self.path)


def parse_use_tree(tokens, i, prefix, out):
    """Parses a use tree at tokens[i]; appends (segments, alias, line) to out; returns the
    index after it. alias is "*" for globs."""
    segments = list(prefix)
    while i < len(tokens):
        kind, value, line = tokens[i]
        if kind == "ident":
            segments.append(value)
            i += 1
            if i < len(tokens) and tokens[i][0] == "path_sep":
                i += 1
                continue
            alias = value
            if i < len(tokens) and tokens[i][1] == "as" and i + 1 < len(tokens):
                alias = tokens[i + 1][1]
                i += 2
            out.append((segments, alias, line))
            return i
        if kind == "path_sep":  # a leading `::`
            i += 1
            continue
        if value == "*":
            out.append((segments, "*", line))
            return i + 1
        if value == "{":
            i += 1
            while i < len(tokens) and tokens[i][1] != "}":
                if tokens[i][1] == ",":
                    i += 1
                    continue
                i = parse_use_tree(tokens, i, segments, out)
            return i + 1
        return i + 1
    return i


def child_dir(file, is_dir_owner):
    base, name = os.path.split(file)
    if is_dir_owner:
        return base
    return os.path.join(base, os.path.splitext(name)[0])


def load_file(module, file, dir_owner, modules, errors):
    with open(file, encoding="utf-8") as f:
        tokens = tokenize(f.read())
    directory = child_dir(file, dir_owner)
    # Stack of (module, brace depth at which its body started, directory for its children).
    stack = [(module, 0, directory)]
    depth = 0
    visibility = False
    path_attr = None
    cfg_test = False
    i = 0
    while i < len(tokens):
        kind, value, line = tokens[i]
        current, base, cdir = stack[-1]
        if value == "{":
            depth += 1
        elif value == "}":
            depth -= 1
            if depth < base:
                stack.pop()
        if kind == "punct" and value == "#" and i + 2 < len(tokens) and tokens[i + 1][1] == "[":
            if tokens[i + 2][1] == "path" and i + 4 < len(tokens):
                path_attr = "?"  # #[path] modules are not followed; none are expected
            if [t[1] for t in tokens[i + 2 : i + 6]] == ["cfg", "(", "test", ")"]:
                cfg_test = True
        if kind == "ident" and value == "pub":
            visibility = True
            i += 1
            if i < len(tokens) and tokens[i][1] == "(":
                j = i
                while j < len(tokens) and tokens[j][1] != ")":
                    j += 1
                i = j + 1
            continue
        if kind == "ident" and value == "mod" and i + 2 < len(tokens) and tokens[i + 1][0] == "ident":
            name, after = tokens[i + 1][1], tokens[i + 2][1]
            child_path = current.path + (name,)
            if after == ";":
                if path_attr is not None:
                    errors.append(f"{file}:{line}: #[path] module {name} not followed")
                else:
                    candidates = [os.path.join(cdir, name + ".rs"), os.path.join(cdir, name, "mod.rs")]
                    found = [c for c in candidates if os.path.exists(c)]
                    if found:
                        child = Module(child_path, found[0], current)
                        child.test = child.test or cfg_test
                        current.children[name] = child
                        modules.append(child)
                        load_file(child, found[0], found[0].endswith("mod.rs"), modules, errors)
                i += 3
            elif after == "{":
                child = Module(child_path, file, current)
                child.test = child.test or cfg_test
                current.children[name] = child
                modules.append(child)
                depth += 1
                stack.append((child, depth, os.path.join(cdir, name)))
                i += 3
            else:
                i += 1
            visibility, path_attr, cfg_test = False, None, False
            continue
        if kind == "ident" and value == "use":
            trees = []
            i = parse_use_tree(tokens, i + 1, [], trees)
            for segments, alias, uline in trees:
                if alias == "*":
                    current.globs.append(segments)
                    continue
                if segments and segments[-1] == "self":
                    segments = segments[:-1]
                    if alias == "self":
                        alias = segments[-1] if segments else alias
                current.imports[alias] = (segments, uline)
                if not visibility:
                    current.private_uses.append((segments, uline))
            visibility = False
            continue
        if kind == "ident" and value in KEYWORDS_ITEM and depth == base:
            if i + 1 < len(tokens) and tokens[i + 1][0] == "ident":
                current.items.add(tokens[i + 1][1])
        if kind == "ident" and value == "macro_rules" and i + 2 < len(tokens):
            current.items.add(tokens[i + 2][1])
        if kind == "ident" or (kind == "path_sep" and i + 1 < len(tokens) and tokens[i + 1][0] == "ident"):
            prev = tokens[i - 1] if i else ("", "", 0)
            if prev[1] != "." and prev[0] != "path_sep" and not (kind == "path_sep" and prev[0] == "ident"):
                segments = []
                j = i
                if kind == "path_sep":
                    j += 1
                while j < len(tokens) and tokens[j][0] == "ident":
                    segments.append(tokens[j][1])
                    if j + 1 < len(tokens) and tokens[j + 1][0] == "path_sep":
                        j += 2
                    else:
                        j += 1
                        break
                if len(segments) > 1:
                    current.paths.append((segments, line))
                elif segments:
                    current.idents.append((segments[0], line))
                i = max(j, i + 1)
                visibility = False
                continue
        if value in (";", "{", "}"):
            visibility, cfg_test = False, False
        i += 1


class Crate:
    def __init__(self, root_file, name):
        self.root = Module((), root_file, None)
        self.name = name
        self.modules = [self.root]
        self.errors = []
        load_file(self.root, root_file, True, self.modules, self.errors)

    def lookup(self, path):
        module = self.root
        for name in path:
            module = module.children.get(name)
            if module is None:
                return None
        return module

    def absolute(self, module, segments, hops=0):
        """The path from the crate root that `segments`, written in `module`, names, or None
        when it names nothing of the crate (another crate, a local, a primitive)."""
        if not segments or hops > 16:
            return None
        first, rest = segments[0], segments[1:]
        if first == "crate":
            return list(rest)
        if first in ("self", "super"):
            base = module
            while segments and segments[0] in ("self", "super"):
                if segments[0] == "super":
                    base = base.parent
                    if base is None:
                        return None
                segments = segments[1:]
            return list(base.path) + list(segments)
        if first in module.children:
            return list(module.path) + list(segments)
        if first in module.imports:
            target = self.absolute(module, module.imports[first][0], hops + 1)
            return None if target is None else target + list(rest)
        if first in module.items:
            return list(module.path) + list(segments)
        for glob in module.globs:
            if glob and glob[0] == first:
                continue  # `use Enum::*`: not a module of the crate's globs
            source = self.lookup(self.absolute(module, glob, hops + 1) or ["\0"])
            if source is not None and (
                first in source.children or first in source.items or first in source.imports
            ):
                return list(source.path) + list(segments)
        return None

    def defining_module(self, path, hops=0):
        """The module that defines the item `path` names (None for a module or nothing)."""
        module = self.root
        i = 0
        while i < len(path) and path[i] in module.children:
            module = module.children[path[i]]
            i += 1
        if i == len(path) or hops > 16:
            return None
        name = path[i]
        if name in module.imports and name not in module.items:
            target = self.absolute(module, module.imports[name][0])
            return None if target is None else self.defining_module(target + path[i + 1 :], hops + 1)
        if name in module.items:
            return module
        for glob in module.globs:
            target = self.absolute(module, glob)
            source = self.lookup(target) if target is not None else None
            if source is not None and source is not module:
                found = self.defining_module(list(source.path) + path[i:], hops + 1)
                if found is not None:
                    return found
        return module  # an enum variant, a macro, ... : taken as the module's own


def references(crate, module):
    """(target module, evidence) for everything `module`'s code uses."""
    out = []

    def add(segments, line):
        target = crate.absolute(module, segments)
        if target is None:
            return
        defining = crate.defining_module(target)
        if defining is not None and defining is not module:
            out.append((defining, f"{module.file}:{line}: {'::'.join(segments)}"))

    for segments, line in module.private_uses:
        add(segments, line)
    for segments, line in module.paths:
        add(segments, line)
    for name, line in module.idents:
        if name in module.imports or (name not in module.items and name not in module.children):
            add([name], line)
    return out


def edge_nodes(m, t, own_items):
    """The edge (from node, to node) a reference from module m to module t makes, or None."""
    mp, tp = m.path, t.path
    common = 0
    while common < min(len(mp), len(tp)) and mp[common] == tp[common]:
        common += 1
    level = mp[:common]
    def side(p):
        return ("own", level) if len(p) == common else ("sub", p[: common + 1])
    a, b = side(mp), side(tp)
    if a == b or (not own_items and "own" in (a[0], b[0])):
        return None
    return (a, b)


def strongly_connected(nodes, edges):
    index, low, on_stack, stack, result = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        work = [(v, iter(sorted(edges.get(v, ()))))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        while work:
            node, children = work[-1]
            advanced = False
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    advanced = True
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == node:
                        break
                result.append(component)

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return result


def node_name(node):
    kind, path = node
    name = "::".join(("crate",) + path)
    return f"{name} (own items)" if kind == "own" else name


def check_crate(crate, verbose, own_items):
    edges = defaultdict(set)
    evidence = defaultdict(list)
    for module in crate.modules:
        if module.test:
            continue
        for target, why in references(crate, module):
            edge = edge_nodes(module, target, own_items)
            if edge is None:
                continue
            edges[edge[0]].add(edge[1])
            evidence[edge].append(why)
    nodes = set(edges) | {w for ws in edges.values() for w in ws}
    circles = [c for c in strongly_connected(nodes, edges) if len(c) > 1]
    for component in circles:
        members = set(component)
        print(f"{crate.name}: import circle between {', '.join(sorted(node_name(n) for n in members))}")
        for a in sorted(members):
            for b in sorted(edges[a] & members):
                whys = evidence[(a, b)]
                print(f"  {node_name(a)} -> {node_name(b)}")
                for why in whys[: None if verbose else 3]:
                    print(f"      {why}")
                if not verbose and len(whys) > 3:
                    print(f"      ... {len(whys) - 3} more (-v)")
    for error in crate.errors:
        print(f"{crate.name}: {error}")
    return len(circles)


def crate_roots(crate_dir):
    src = os.path.join(crate_dir, "src")
    roots = [os.path.join(src, f) for f in ("lib.rs", "main.rs") if os.path.exists(os.path.join(src, f))]
    bin_dir = os.path.join(src, "bin")
    if os.path.isdir(bin_dir):
        roots += sorted(os.path.join(bin_dir, f) for f in os.listdir(bin_dir) if f.endswith(".rs"))
    return roots


def main(argv):
    verbose = "-v" in argv
    own_items = "--own-items" in argv
    dirs = [a for a in argv if not a.startswith("-")]
    if not dirs:
        top = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
        crates = os.path.join(os.path.relpath(top), "crates")
        dirs = sorted(os.path.join(crates, d) for d in os.listdir(crates))
    total = checked = 0
    for crate_dir in dirs:
        for root in crate_roots(crate_dir):
            name = f"{os.path.normpath(crate_dir)} ({os.path.basename(root)})"
            crate = Crate(root, name)
            checked += len(crate.modules)
            total += check_crate(crate, verbose, own_items)
    if total:
        print(f"{total} import circle(s) between modules; see scripts/module-cycles.py for the rule")
        return 1
    print(f"no import circle between the {checked} modules of {len(dirs)} crate(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
