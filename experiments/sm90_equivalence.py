"""Proof that the product Hopper kernel is the full-variant kernel at its production settings.

Historical: it applies to the product kernel of commit 650565e, before the kernel took f16 accumulators and the
fold on the index key (docs/perf-notes.md); run it from that commit.

For every configuration serving builds (``sm90.served_configs()``: next_n x heads within 32 KB of
queries, fp32/bf16/fp16 logits, [B] and [B, next_n] lengths, the default rows per wgmma), this
preprocesses

* OLD: ``cuda/paged_logits_sm90_variants.cu`` (the kernel of commit 1e88a43, byte for byte) with
  the defines and wgmma wrappers ``sm90_variants.source`` makes at ``PRODUCTION`` -- the program
  text 1e88a43's ``sm90.build`` compiled (``--against-git`` checks that too, from git), and
* NEW: exactly what the product compiles (``nvrtc.program_text`` of ``sm90._spec(config)``),

with ``gcc -E -P -x c++ -undef -nostdinc`` (the kernel includes no header), tokenises both and
compares the token streams after these normalisations, each of which leaves the compiled code
unchanged:

1. whitespace and comments (the preprocessor and the tokeniser drop them);
2. integer constant folding: a parenthesised group of plain integer literals and operators is
   replaced by its value (the product passes the shared-memory layout as numbers, the old file
   derived it with macros: ``(1 * (64 * 128))`` against ``8192``);
3. ``static_assert(...);`` declarations are dropped from both (they emit no code; the product
   checks its layout with new ones);
4. device functions the production build never calls are dropped from OLD (``UNUSED_IN_OLD``;
   the script checks that no other token of OLD names them);
5. source edits on OLD before preprocessing (``OLD_EDITS``; each must match exactly as often as
   stated): statements and locals that are empty or dead at the production settings.

Usage (CPU; needs gcc)::

    PYTHONPATH=. python3 -m experiments.sm90_equivalence [--against-git] [--cubin]

``--cubin`` also compiles both with NVRTC (needs ``cuda-bindings``; about 3 s per build) and
compares the kernel's code sections of the two cubins byte for byte.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys

from sglang_fp4_indexer.ops import nvrtc, sm90

from . import sm90_variants

#: Device functions of the old file that the production build does not call.
UNUSED_IN_OLD = ("clock_stamp", "decode_word", "decode_word_split", "decode_word_split2", "group_lut2",
                 "wgmma_f8_neg", "wgmma_tf32")
#: (old text, replacement, occurrences, why) applied to OLD before preprocessing.
OLD_EDITS = (
    (re.compile(r"\bTL\(\d\);"), "", 6,
     "the timeline stamp TL(k) is defined empty at PROBE 0: each TL(k); is an empty statement"),
    ("(PROBE & 64) || ", "", 1, "PROBE is 0: (0 & 64) || x is x"),
    (" && !(PROBE & 2)", "", 1, "PROBE is 0: x && !(0 & 2) is x"),
    ("HEADSUM == 2 ? n >= 4 : (n != 0 && n != 2)", "n >= 4", 1, "HEADSUM is 2"),
    ("    const float* w_mine = w_smem + c * W_STRIDE;", "", 1,
     "a local only the fp32 head sum (HEADSUM 0) reads: dead at HEADSUM 2"),
    ("    const u32 minus1 = static_cast<u32>(block_kv >> 31) - 1u;", "", 1,
     "a local only SPLIT_SIGN 2 reads: dead at SPLIT_SIGN 3"),
)

_TOKEN = re.compile(r"""
    (?P<pragma>\#[^\n]*)
  | (?P<string>"(?:\\.|[^"\\])*")
  | (?P<char>'(?:\\.|[^'\\])*')
  | (?P<number>\.?\d(?:[eEpP][+-]|[\w.])*)
  | (?P<ident>[A-Za-z_]\w*)
  | (?P<punct><<=|>>=|->\*?|\+\+|--|<<|>>|<=|>=|==|!=|&&|\|\||\+=|-=|\*=|/=|%=|&=|\|=|\^=|::|\.\.\.|[{}\[\]();,.<>+\-*/%&|^!~?:=])
  | (?P<space>\s+)
""", re.VERBOSE)
_INT = re.compile(r"(?:0[xX][0-9a-fA-F]+|\d+)\Z")
_OPERATORS = {"+", "-", "*", "/", "%", "<<", ">>", "&", "|", "^", "~", "!", "==", "!=", "<", ">", "<=", ">=",
              "&&", "||", "?", ":"}


def tokens(text: str) -> list[str]:
    """C++ tokens of preprocessed ``text`` (a ``#pragma`` line is one token).

    Raises:
        ValueError: a character no token starts with.
    """
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise ValueError(f"text: cannot tokenise at {text[pos:pos + 40]!r}")
        if m.lastgroup == "pragma":
            out.append(" ".join(m.group().split()))
        elif m.lastgroup != "space":
            out.append(m.group())
        pos = m.end()
    return out


def _value(toks: list[str]) -> int:
    """Value of a C integer constant expression of plain literals (precedence climbing; ``/`` truncates)."""
    pos = 0

    def peek():
        return toks[pos] if pos < len(toks) else None

    def take():
        nonlocal pos
        pos += 1
        return toks[pos - 1]

    def unary():
        t = take()
        if t in ("+", "-", "~", "!"):
            v = unary()
            return {"+": v, "-": -v, "~": ~v, "!": int(not v)}[t]
        if not _INT.match(t):
            raise ValueError(t)
        return int(t, 0)

    levels = [("||",), ("&&",), ("|",), ("^",), ("&",), ("==", "!="), ("<", ">", "<=", ">="), ("<<", ">>"),
              ("+", "-"), ("*", "/", "%")]

    def binary(level):
        if level == len(levels):
            return unary()
        v = binary(level + 1)
        while peek() in levels[level]:
            op, w = take(), binary(level + 1)
            if op == "/":
                v = int(v / w) if w else _undefined()
            elif op == "%":
                v = v - int(v / w) * w if w else _undefined()
            else:
                v = {"||": lambda: int(bool(v) or bool(w)), "&&": lambda: int(bool(v) and bool(w)),
                     "|": lambda: v | w, "^": lambda: v ^ w, "&": lambda: v & w, "==": lambda: int(v == w),
                     "!=": lambda: int(v != w), "<": lambda: int(v < w), ">": lambda: int(v > w),
                     "<=": lambda: int(v <= w), ">=": lambda: int(v >= w), "<<": lambda: v << w,
                     ">>": lambda: v >> w, "+": lambda: v + w, "-": lambda: v - w, "*": lambda: v * w}[op]()
        return v

    def ternary():
        c = binary(0)
        if peek() == "?":
            take()
            a = ternary()
            if take() != ":":
                raise ValueError("?:")
            b = ternary()
            return a if c else b
        return c

    v = ternary()
    if pos != len(toks):
        raise ValueError(toks[pos])
    return v


def _undefined():
    raise ValueError("division by zero")


def fold(toks: list[str]) -> list[str]:
    """Replace each parenthesised group of plain integer literals and at least one operator by its value,
    innermost first, until none is left."""
    toks = list(toks)
    changed = True
    while changed:
        changed = False
        out: list[str] = []
        opens: list[int] = []
        for t in toks:
            out.append(t)
            if t == "(":
                opens.append(len(out) - 1)
            elif t == ")" and opens:
                start = opens.pop()
                inner = out[start + 1:-1]
                if inner and any(x in _OPERATORS for x in inner) and all(x in _OPERATORS or _INT.match(x)
                                                                         for x in inner):
                    try:
                        value = _value(inner)
                    except ValueError:
                        continue
                    del out[start:]
                    out.append(str(value))
                    changed = True
        toks = out
    return toks


def _matching(toks: list[str], i: int, open_: str, close: str) -> int:
    """Index of the bracket closing the one at ``toks[i]``."""
    depth = 0
    for j in range(i, len(toks)):
        depth += toks[j] == open_
        depth -= toks[j] == close
        if depth == 0:
            return j
    raise ValueError(f"unbalanced {open_} at token {i}")


def drop_static_asserts(toks: list[str]) -> list[str]:
    """``toks`` without its ``static_assert(...);`` declarations."""
    out, i = [], 0
    while i < len(toks):
        if toks[i] == "static_assert":
            end = _matching(toks, i + 1, "(", ")")
            i = end + 2 if end + 1 < len(toks) and toks[end + 1] == ";" else end + 1
            continue
        out.append(toks[i])
        i += 1
    return out


def drop_functions(toks: list[str], names) -> list[str]:
    """``toks`` without the ``__device__ __forceinline__ <type> NAME(...) {...}`` definitions of ``names``.

    Raises:
        ValueError: a name not defined exactly once, or named anywhere else.
    """
    toks = list(toks)
    for name in names:
        starts = [i for i in range(len(toks) - 4) if toks[i] == "__device__" and toks[i + 1] == "__forceinline__"
                  and toks[i + 3] == name and toks[i + 4] == "("]
        if len(starts) != 1:
            raise ValueError(f"{name}: defined {len(starts)} times")
        i = starts[0]
        body = _matching(toks, i + 4, "(", ")") + 1
        if toks[body] != "{":
            raise ValueError(f"{name}: no body")
        end = _matching(toks, body, "{", "}")
        toks = toks[:i] + toks[end + 1:]
        if name in toks:
            raise ValueError(f"{name}: still named after its definition was dropped (it is used)")
    return toks


def preprocess(text: str) -> str:
    """``gcc -E -P -x c++ -undef -nostdinc`` of ``text``.

    Raises:
        RuntimeError: gcc missing or failing.
    """
    gcc = shutil.which("gcc")
    if gcc is None:
        raise RuntimeError("gcc is not installed")
    r = subprocess.run([gcc, "-E", "-P", "-x", "c++", "-undef", "-nostdinc", "-"], input=text, capture_output=True,
                       text=True)
    if r.returncode:
        raise RuntimeError(f"gcc -E failed:\n{r.stderr}")
    return r.stdout


def old_text(config: sm90.Config) -> str:
    """OLD's program text for ``config`` with ``OLD_EDITS`` applied.

    Raises:
        ValueError: an edit that does not match as often as stated.
    """
    text = sm90_variants.source(config.next_n, config.heads, config.out_kind, config.lens_2d,
                                **sm90_variants.PRODUCTION, mma_rows=config.mma_rows)
    for old, new, count, _why in OLD_EDITS:
        if isinstance(old, re.Pattern):
            text, n = old.subn(new, text)
        else:
            n = text.count(old)
            text = text.replace(old, new)
        if n != count:
            raise ValueError(f"edit {old!r}: {n} matches, expected {count}")
    return text


def new_text(config: sm90.Config) -> str:
    """The program text the product compiles for ``config``."""
    spec = sm90._spec(config)
    return nvrtc.program_text(spec.source, spec.defines)


def normalised(text: str, unused=()) -> list[str]:
    """Tokens of ``text`` preprocessed, without static_asserts and ``unused`` functions, constants folded."""
    return fold(drop_functions(drop_static_asserts(tokens(preprocess(text))), unused))


def compare(config: sm90.Config) -> str | None:
    """``None`` when OLD and NEW are the same token stream for ``config``, else the first difference."""
    a, b = normalised(old_text(config), UNUSED_IN_OLD), normalised(new_text(config))
    if a == b:
        return None
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return (f"{config}: token {i} of {len(a)} / {len(b)}:\n  old: {' '.join(a[max(0, i - 20):i + 20])}\n"
            f"  new: {' '.join(b[max(0, i - 20):i + 20])}")


def against_git(commit: str = "1e88a43") -> list[str]:
    """Differences between ``cuda/paged_logits_sm90_variants.cu`` and the kernel at ``commit`` (empty: none)."""
    old = subprocess.run(["git", "show", f"{commit}:sglang_fp4_indexer/ops/cuda/paged_logits_sm90.cu"],
                         capture_output=True, text=True, check=True).stdout
    return [] if old == sm90_variants.SOURCE.read_text() else [f"{sm90_variants.SOURCE} differs from {commit}"]


def _code_sections(cubin: bytes) -> dict[str, bytes]:
    """The ``.text.*``, ``.nv.info.*``, ``.nv.shared.*`` and ``.nv.constant*`` sections of an ELF64 cubin."""
    import struct

    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + k * shentsize) for k in range(shnum)]
    names = heads[shstrndx]
    out = {}
    for h in heads:
        start = names[4] + h[0]
        name = cubin[start:cubin.index(b"\0", start)].decode()
        if name.startswith((".text.", ".nv.info.", ".nv.shared.", ".nv.constant")):
            out[name] = cubin[h[4]:h[4] + h[5]] if h[1] != 8 else bytes(h[5])  # SHT_NOBITS: its size
    return out


def compare_cubins(config: sm90.Config) -> str | None:
    """``None`` when NVRTC's cubins of OLD (unedited) and NEW for ``config`` have the same code sections."""
    old = nvrtc.compile_cubin(sm90_variants.source(config.next_n, config.heads, config.out_kind, config.lens_2d,
                                                   **sm90_variants.PRODUCTION, mma_rows=config.mma_rows),
                              "paged_logits_sm90.cu", "sm_90a")[0]
    new = sm90.build(config)[0]
    a, b = _code_sections(old), _code_sections(new)
    if a == b:
        return None
    return f"{config}: sections differ: {sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against-git", action="store_true", help="also check the variants file against commit 1e88a43")
    ap.add_argument("--cubin", action="store_true", help="also compare NVRTC's cubins (needs cuda-bindings)")
    args = ap.parse_args(argv)
    problems = against_git() if args.against_git else []
    configs = list(sm90.served_configs())
    for config in configs:
        why = compare(config)
        if why:
            problems.append(why)
    print(f"token streams: {len(configs)} served configurations, {len(configs) - len(problems)} identical")
    for _old, _new, count, why in OLD_EDITS:
        print(f"  edit of OLD ({count}x): {why}")
    print(f"  dropped from OLD, never called: {', '.join(UNUSED_IN_OLD)}")
    if args.cubin:
        bad = [why for why in map(compare_cubins, configs) if why]
        print(f"cubins: {len(configs)} configurations, {len(configs) - len(bad)} with identical code sections")
        problems += bad
    for why in problems:
        print(why, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
