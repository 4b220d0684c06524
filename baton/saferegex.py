"""Run a user's regular expression safely: the one place every user pattern goes through.

Users and models write patterns Baton runs: playbook ``when`` and team route ``when``
(:mod:`baton.agents.spec`, :mod:`baton.agents.teams`), and a step's JSON Schema ``pattern`` /
``patternProperties`` (:mod:`baton.runs.deliverables`). Each of them is

- parsed with the `regex` module's own parser and refused when the compiled pattern
  would be too big (:func:`expanded_size`): `regex` copies the body of a counted repeat
  ``{n}`` / ``{n,m}`` ``n`` times when compiling, so nested counts take seconds and
  gigabytes (``((\\\\{1000}){1000}){3}`` is 3,000,000 copies of ``\\\\``);
- compiled without `regex`'s own unbounded-by-size cache, into one LRU cache bounded by
  the summed expanded size of its entries (which also bounds their count);
- searched with a time limit and ``concurrent=True``, so a backtracking pattern
  (``^(a+)+$``) releases the GIL and stops at the limit instead of stalling the process.

Pure and I/O-free: safe to import from workflow code.
"""

from __future__ import annotations

import threading
from typing import Any

import cachetools
import regex
from regex import _regex_core

#: The parser `regex.compile` itself uses (private, so untyped here; tests pin its shape).
_core: Any = _regex_core

#: Largest expanded size (atoms, after counted repeats are copied out) a user pattern may
#: have. ``a{10000}`` (10,000) is accepted and takes ~0.5 s and ~1.3 MB to compile;
#: ``a{10000}b`` (10,001) is refused.
MAX_EXPANDED_SIZE = 10_000
#: Summed expanded size of the compiled patterns kept in the cache: about 134 bytes per
#: atom once compiled (``a{10000}`` holds 1.34 MB), so ~34 MB at most.
CACHE_MAX_SIZE = 250_000
#: Every cache entry weighs at least this much, which caps the cache at 1,024 entries.
CACHE_MIN_WEIGHT = CACHE_MAX_SIZE // 1024


class PatternTimeout(Exception):
    """A search ran past its time limit (the pattern backtracks on this text)."""


def _parse(pattern: str, flags: int) -> Any:
    """The parse tree `regex.compile` would build (same retry on a global inline flag)."""
    global_flags = flags
    while True:
        source = _core.Source(pattern)
        info = _core.Info(global_flags, source.char_type, {})
        source.ignore_space = bool(info.flags & regex.VERBOSE)
        try:
            parsed = _core._parse_pattern(source, info)
        except _core._UnscopedFlagSet:
            global_flags = info.global_flags
            continue
        if not source.at_end():
            raise regex.error("unbalanced parenthesis", pattern, source.pos)
        return parsed


def _size(node: Any) -> int:
    """Atoms of ``node`` once counted repeats are copied out (`regex` copies ``min_count``
    times; the optional part of ``{n,m}`` and open repeats compile to a loop)."""
    if isinstance(node, _core.GreedyRepeat):  # LazyRepeat and PossessiveRepeat subclass it
        return max(int(node.min_count), 1) * _size(node.subpattern)
    if isinstance(node, _core.SetBase):  # one character class is one atom
        return 1
    total = 0
    for value in vars(node).values():
        children = value if isinstance(value, list | tuple) else [value]
        total += sum(_size(c) for c in children if isinstance(c, _core.RegexBase))
    return max(total, 1)


def expanded_size(pattern: str, flags: int = 0) -> int:
    """Atoms the compiled ``pattern`` holds once `regex` copies out its counted repeats.

    ``a{100}`` is 100, ``(?:ab){3}c`` 7, ``(a{100}){100}`` 10,000, ``a{2,}`` and
    ``a{0,9}`` 2 and 1 (only the minimum is copied), ``[a-z]`` 1. Parsed with the parser
    `regex.compile` uses, so escapes, classes, inline flags and fuzzy constraints are read
    exactly as the compiler reads them. Raises ``ValueError`` for an invalid pattern.
    """
    try:
        return _size(_parse(pattern, flags))
    except (regex.error, OverflowError, RecursionError, ValueError) as exc:
        raise ValueError(f"not a valid regular expression: {exc}") from exc


def _weight(entry: tuple[regex.Pattern[str], int]) -> int:
    return max(entry[1], CACHE_MIN_WEIGHT)


_cache: cachetools.LRUCache[tuple[str, int], tuple[regex.Pattern[str], int]] = cachetools.LRUCache(
    maxsize=CACHE_MAX_SIZE, getsizeof=_weight
)


@cachetools.cached(_cache, lock=threading.Lock())
def _compiled(pattern: str, flags: int) -> tuple[regex.Pattern[str], int]:
    size = expanded_size(pattern, flags)
    if size > MAX_EXPANDED_SIZE:
        msg = (
            f"the pattern expands to {size} items once its counted repeats are copied out; "
            f"at most {MAX_EXPANDED_SIZE} are allowed: simplify it"
        )
        raise ValueError(msg)
    try:
        return regex.compile(pattern, flags, cache_pattern=False), size
    except (regex.error, OverflowError, RecursionError, ValueError) as exc:
        raise ValueError(f"not a valid regular expression: {exc}") from exc


def compile_user_pattern(pattern: str, flags: int = 0) -> regex.Pattern[str]:
    """Compile a user's pattern within :data:`MAX_EXPANDED_SIZE`, cached (size-bounded LRU).

    Raises ``ValueError`` naming the problem (invalid, or expanding past the bound).
    """
    return _compiled(pattern, flags)[0]


def search(pattern: str, text: str, *, timeout: float, flags: int = 0) -> bool:
    """Whether ``pattern`` is found in ``text``, searching at most ``timeout`` seconds.

    Raises :class:`PatternTimeout` when the limit (or a non-positive ``timeout``) is hit,
    and ``ValueError`` when :func:`compile_user_pattern` refuses the pattern.
    """
    if timeout <= 0:
        raise PatternTimeout(f"no time left to search {pattern!r}")
    compiled = compile_user_pattern(pattern, flags)
    try:
        return compiled.search(text, timeout=timeout, concurrent=True) is not None
    except TimeoutError as exc:
        raise PatternTimeout(f"{pattern!r} took over {timeout:g} s on this text") from exc
