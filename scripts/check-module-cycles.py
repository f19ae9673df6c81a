#!/usr/bin/env python3
"""Fails when the modules of any crate of the workspace import each other in a cycle.

For every crate (a folder with Cargo.toml and src/), each module file is read and every path
it uses is resolved to the module it names: `crate::a::b`, `super::x`, `self::y` and bare
`a::b` inside a `use` (Rust 2018 paths relative to the current module), including grouped
imports (`use crate::{a, b::{c, d}}`) and paths written inline in code (`crate::a::f()`,
`super::b::C`). An edge A -> B means module A names something of module B (B not an
ancestor of A: a child may always use its parent's items). Test-only modules (`tests`,
`*_tests.rs`, `*_props.rs`, anything under `#[cfg(test)]` files) are skipped: they may
depend on whatever they test. A cycle (found by Tarjan's strongly connected components) is
printed and the script exits 1.

Usage: scripts/check-module-cycles.py [ROOT]   (ROOT defaults to the repository root)
"""

import os
import re
import sys

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")

MOD_DECL = re.compile(
    r'^\s*(?:#\[path\s*=\s*"([^"]+)"\]\s*)?(?:pub(?:\([^)]*\))?\s+)?mod\s+([a-z_][a-z0-9_]*)\s*;',
    re.M,
)
PATH_ATTR = re.compile(r'#\[path\s*=\s*"([^"]+)"\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+([a-z_][a-z0-9_]*)\s*;')
CFG_TEST_MOD = re.compile(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+([a-z_][a-z0-9_]*)")
USE_STMT = re.compile(r"\buse\s+([^;]+);", re.S)
INLINE = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
ALIASED = re.compile(r"(?<![:\w])([a-z_][a-z0-9_]*)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")


def strip_comments(text):
    """Drops comments and the contents of string and char literals, in one left-to-right
    pass (a `"/*"` inside a string is not a comment; a `//` inside one is not either)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        two = text[i : i + 2]
        if two == "//":
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif two == "/*":
            depth, i = 1, i + 2
            while i < n and depth:
                if text[i : i + 2] == "/*":
                    depth, i = depth + 1, i + 2
                elif text[i : i + 2] == "*/":
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = text.find('"' + hashes, i + len(hashes) + 2)
            out.append('""')
            i = n if end < 0 else end + 1 + len(hashes)
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            out.append('""')
            i += 1
        elif c == "'" and re.match(r"'(\\.[^']*|[^'\\])'", text[i:]):
            m = re.match(r"'(\\.[^']*|[^'\\])'", text[i:])
            out.append("' '")
            i += m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def strip_test_blocks(text):
    """Drops `#[cfg(test)] mod x { ... }` bodies written inline."""
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+[a-z_][a-z0-9_]*\s*\{", text):
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


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e'] (aliases and globs kept as paths)."""
    tree = re.sub(r"\s+", "", tree)
    depth = 0
    for k, ch in enumerate(tree):
        if ch == "{":
            if depth == 0:
                prefix, inner = tree[:k], tree[k + 1 : tree.rindex("}")]
                parts, d, cur = [], 0, ""
                for c in inner:
                    if c == "," and d == 0:
                        parts.append(cur)
                        cur = ""
                        continue
                    d += {"{": 1, "}": -1}.get(c, 0)
                    cur += c
                parts.append(cur)
                res = []
                for p in parts:
                    if p:
                        for e in expand_use(p):
                            res.append(prefix + e if e != "self" else prefix.rstrip(":"))
                return res
            depth += 1
    return [re.sub(r"as[A-Za-z_].*$", "", tree) if "as" in tree and not tree.endswith("as") else tree]


class Crate:
    def __init__(self, root):
        self.root = root
        self.modules = {}  # module path tuple -> file
        self.test_only = set()

    def load(self):
        src = os.path.join(self.root, "src")
        for top in ("lib.rs", "main.rs"):
            f = os.path.join(src, top)
            if os.path.exists(f):
                self.walk((), f, src, top == "lib.rs" or True)

    def walk(self, path, file, dirpath, is_root):
        if path in self.modules:
            return
        self.modules[path] = file
        text = open(file, encoding="utf-8").read()
        clean = strip_comments(text)
        tests = set(CFG_TEST_MOD.findall(clean))
        # Children are found in `dir/name.rs` or `dir/name/mod.rs`, where `dir` is the folder
        # of a root/mod.rs file, or `parent/stem/` for `parent/stem.rs`.
        base = os.path.basename(file)
        if is_root or base == "mod.rs":
            child_dir = os.path.dirname(file)
        else:
            child_dir = os.path.join(os.path.dirname(file), base[:-3])
        for m in MOD_DECL.finditer(clean):
            explicit, name = m.group(1), m.group(2)
            attr = re.search(r'#\[path\s*=\s*"([^"]+)"\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+' + name + r"\s*;", clean)
            explicit = attr.group(1) if attr else None
            if explicit:
                cand = [os.path.join(child_dir if not (is_root or base == "mod.rs") else os.path.dirname(file), explicit)]
                cand.append(os.path.join(os.path.dirname(file), explicit))
            else:
                cand = [os.path.join(child_dir, name + ".rs"), os.path.join(child_dir, name, "mod.rs")]
            f = next((c for c in cand if os.path.exists(c)), None)
            if not f:
                continue
            child = path + (name,)
            if name in tests or name == "tests" or re.search(r"(_tests|_props|tests)\.rs$", f):
                self.test_only.add(child)
                continue
            self.walk(child, f, os.path.dirname(f), False)

    def resolve(self, here, segs):
        """The longest known module prefix a path names, relative to module `here`."""
        if not segs:
            return None
        if segs[0] == "crate":
            cur, rest = (), segs[1:]
        elif segs[0] in ("super", "self"):
            cur, rest = here, segs
            while rest and rest[0] in ("super", "self"):
                if rest[0] == "super":
                    cur = cur[:-1]
                rest = rest[1:]
        else:
            # A bare path in `use` (2018): a child of this module, else an external crate.
            if here + (segs[0],) in self.modules:
                cur, rest = here, segs
            else:
                return None
        best = cur
        for s in rest:
            if cur + (s,) in self.modules:
                cur = cur + (s,)
                best = cur
            else:
                break
        return best

    def edges(self):
        out = {m: set() for m in self.modules}
        for m, f in self.modules.items():
            text = strip_test_blocks(strip_comments(open(f, encoding="utf-8").read()))
            paths = []
            for u in USE_STMT.findall(text):
                u = u.strip()
                if u.startswith("::"):
                    continue
                paths += expand_use(u)
            # Names a `use` brought in (`use crate::roles::{self}` makes `roles::relay::run`
            # in code a path into `crate::roles::relay`).
            aliases = {}
            for p in paths:
                segs = [s for s in p.split("::") if s]
                if segs and segs[-1] not in ("*", "self", "super", "crate"):
                    aliases[segs[-1]] = segs
            for kw, rest in INLINE.findall(text):
                paths.append(kw + rest)
            for head, rest in ALIASED.findall(text):
                if head in aliases and head not in ("crate", "super", "self"):
                    paths.append("::".join(aliases[head]) + rest)
            for p in paths:
                segs = tuple(s for s in p.split("::") if s and s != "*")
                target = self.resolve(m, segs)
                if target is None or target == m:
                    continue
                # Using an ancestor (a parent's items) or a descendant is the tree, not a cycle.
                if m[: len(target)] == target or target[: len(m)] == m:
                    continue
                out[m].add(target)
        return out


def cycles(graph):
    index, low, stack, on, res, n = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                res.append(comp)

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            strong(v)
    return res


def name(m):
    return "crate::" + "::".join(m) if m else "crate"


def main():
    root = os.path.abspath(ROOT)
    bad = 0
    crates = sorted(
        d for d in os.listdir(root)
        if os.path.exists(os.path.join(root, d, "Cargo.toml")) and os.path.isdir(os.path.join(root, d, "src"))
    )
    for d in crates:
        c = Crate(os.path.join(root, d))
        c.load()
        g = c.edges()
        for comp in cycles(g):
            bad += 1
            members = set(comp)
            print(f"{d}: module cycle between {', '.join(sorted(name(m) for m in comp))}")
            for m in sorted(comp):
                for t in sorted(g[m] & members):
                    print(f"    {name(m)} -> {name(t)}")
    if bad:
        print(f"{bad} module cycle(s): move the shared pieces down to a module both use")
        return 1
    print(f"no module cycles in {len(crates)} crates")
    return 0


if __name__ == "__main__":
    sys.exit(main())
