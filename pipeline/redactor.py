"""Credentials found in text and replaced by ``[REDACTED:<kind>]``: fast, exact spans,
deterministic.

Pure: text in, text out; no I/O. Three kinds of rule, each finding a secret by its *form* or by
the name it is given — never by how random it looks, so hashes, UUIDs, base64 blobs and commit
ids come back as they were sent:

* **vendor formats**, as data: ``pipeline/secret_formats.toml`` (patterns ported from gitleaks'
  and CredSweeper's MIT-licensed rule files, and our own): ``ghp_…``, ``glpat-….01.…``,
  ``AKIA…``, ``xoxb-…``, ``dckr_pat_…``, a PEM private key block, a JWT (also when its
  signature continues on the next line), …;
* **where a secret stands** (:data:`CONTEXT_RULES`): the password of
  ``scheme://user:password@host`` (an empty user and an e-mail user too), the credential of an
  ``Authorization: Bearer/Basic`` header, ``curl -u user:password``, ``IDENTIFIED BY '…'``,
  ``ConvertTo-SecureString '…'``, an Azure ``AccountKey=…``;
* **values assigned to a secret's name** (:mod:`pipeline.assignment`): ``DB_PASSWORD=…``,
  ``"apiKey": "…"``, ``--token …``, ``<password>…</password>``, …

A scan looks for every rule's keywords at once (an Aho–Corasick automaton over the lower-cased
text) and tries a rule's pattern only where one of its keywords stands, so its cost grows with
the text, not with the number of rules. A placeholder in a vendor's form (``ghp_xxxx…``,
``xoxp-your-token-here``, ``AKIAIOSFODNN7EXAMPLE``, ``sk_live_…``) is not a secret.

Where two rules find overlapping text, the earlier one wins: formats (in the table's order),
then context rules, then assignments. Redacting is idempotent: a marker is never matched again,
so text redacted twice (a transcript imported, then captured) comes out the same.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import collections
import dataclasses
import functools
import re
import tomllib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

# The Hermes provider runs a copy of this module (and of ``assignment``, ``literal`` and the
# formats file, beside it) inside Hermes' environment, which has the standard library only:
# hence the relative imports, the formats file found beside this one, and a keyword search
# without the automaton there (:class:`_Finds`).
try:
    import ahocorasick
except ImportError:  # pragma: no cover - the provider's copy; the package requires it
    ahocorasick = None

from . import assignment, literal

MARKER_PREFIX = "[REDACTED:"


def marker(kind: str) -> str:
    """What a secret of ``kind`` is replaced by."""
    return f"{MARKER_PREFIX}{kind}]"


#: a marker in text (what is never matched again)
MARKER = re.compile(r"\[REDACTED:[a-z0-9-]+\]")


@dataclasses.dataclass(frozen=True)
class Finding:
    """One secret found: its kind, where it is (character offsets), and the rule that found it
    (a format's ``source:id``, ``sgme:<context rule>``, or ``assignment to NAME``)."""

    kind: str
    start: int
    end: int
    rule: str = ""


@dataclasses.dataclass(frozen=True)
class Rule:
    """One form of credential. ``pattern`` is tried where one of ``keywords`` (lower case)
    stands, starting there or up to ``back`` characters before it, and must contain it; the
    ``group`` (else the first group that matched, else the whole match) is the secret, which
    ``keep`` may refuse (a placeholder)."""

    id: str
    kind: str
    source: str
    keywords: tuple[str, ...]
    pattern: str
    back: int = 0
    group: int | str | None = None
    keep: Callable[[str, str], bool] | None = None
    what: str = ""
    #: the keyword says only that a match may be somewhere in the text, not where
    anywhere: bool = False

    @functools.cached_property
    def regex(self) -> re.Pattern[str]:
        """The compiled pattern (compiled on first use: most rules never run in a process)."""
        return re.compile(self.pattern)

    @property
    def name(self) -> str:
        """How a finding names the rule."""
        return f"{self.source}:{self.id}"

    def find(self, text: str, at: int, keyword: str) -> tuple[int, int, int] | None:
        """``(match end, secret start, secret end)`` of a match that contains the keyword at
        ``at``, or None."""
        regex = self.regex
        for start in range(max(0, at - self.back), at + 1):  # leftmost first
            m = regex.match(text, start)
            if m is None or m.end() <= at:
                continue
            a, b = self._secret(m)
            if b <= a:
                return None
            check = self.keep or _not_placeholder
            return (m.end(), a, b) if check(text[a:b], keyword) else None
        return None

    def find_all(self, text: str, keyword: str) -> Iterable[tuple[int, int]]:
        """Every secret span of a rule that may match ``anywhere``."""
        check = self.keep or _not_placeholder
        for m in self.regex.finditer(text):
            a, b = self._secret(m)
            if b > a and check(text[a:b], keyword):
                yield a, b

    def _secret(self, m: re.Match[str]) -> tuple[int, int]:
        if self.group is not None:
            return m.span(self.group)
        for name in ("secret", "bare"):
            if name in m.re.groupindex and m.group(name) is not None:
                return m.span(name)
        for g in range(1, m.re.groups + 1):
            if m.group(g):
                return m.span(g)
        return m.span()


# ---------------------------------------------------------------------------------------------
# placeholders in a vendor's form

_PLACEHOLDER = re.compile(
    r"(?i)x{4}|\*{3}|\.{3}|…|#{3}|[<>{}]|\$\{|example|sample|dummy|placeholder|redacted|changeme"
    r"|insert|replace|(?<![A-Za-z])(?:your|here|fake)(?![a-z])"
)
_RUNS = re.compile(r"(.)\1{5,}")
#: words run together in camelCase (``requiredCharacteristicTypes``): an identifier
_CAMEL_WORDS = re.compile(r"[a-z]+(?:[A-Z][a-z]+){2,}")


def _not_placeholder(secret: str, keyword: str) -> bool:
    """Whether a value of a vendor's form is real: no mask, no placeholder word, no typed run
    (``123456``), varied, and not an identifier (the vendor's prefix left out of the test)."""
    body = secret[len(keyword) :] if secret.lower().startswith(keyword) else secret
    if _PLACEHOLDER.search(body) or literal.sequential(body):
        return False
    if len(_RUNS.sub("", body)) < len(body) // 2:  # AKIAZZZZZZZZZZZZZZZZ, glc_1111…: a mask
        return False
    if len(body) >= 16 and body.isalpha() and body.islower():
        return False  # s.thisstringisalllowercase: words, not a key (an AWS id may be capitals)
    if _CAMEL_WORDS.fullmatch(body.strip("_-.")):
        return False
    return len(set(body)) >= min(8, len(body) // 2)


# ---------------------------------------------------------------------------------------------
# the rules

FORMATS_FILE = "secret_formats.toml"


def _pem(secret: str, keyword: str) -> bool:
    """A PEM block holds a key: at least 64 base64 characters after its first line."""
    parts = secret.split("-----")
    body = parts[2] if len(parts) > 2 else ""
    return sum(c.isalnum() for c in body.replace("\\n", "")) >= 64 and "anything" not in body


def _jwt(secret: str, keyword: str) -> bool:
    """A JWT's header decodes to JSON (``{"alg": …``), and it is not a placeholder."""
    header = secret.split(".", 1)[0]
    decoded = base64.urlsafe_b64decode(header[: len(header) // 4 * 4]).decode("latin-1")
    return '":' in decoded and not _PLACEHOLDER.search(secret)


def _pem64(secret: str, keyword: str) -> bool:
    """A base64-encoded PEM block decodes to a private key's first line."""
    try:
        decoded = base64.b64decode(secret[: len(secret) // 4 * 4]).decode("latin-1")
    except binascii.Error:
        return False
    return "PRIVATE" in decoded


#: the checks a format may name (``check = "…"``), instead of the placeholder test
CHECKS: dict[str, Callable[[str, str], bool]] = {"pem": _pem, "pem64": _pem64, "jwt": _jwt}


def _load_formats() -> tuple[Rule, ...]:
    data = tomllib.loads(Path(__file__).with_name(FORMATS_FILE).read_text("utf-8"))
    return tuple(
        Rule(
            f["id"],
            f["kind"],
            f["source"],
            tuple(f["keywords"]),
            f["pattern"],
            back=f.get("back", 0),
            group=f.get("group"),
            keep=CHECKS[f["check"]] if "check" in f else None,
            what=f.get("what", ""),
            anywhere=f.get("anywhere", False),
        )
        for f in data["format"]
    )


#: the vendor formats and structures (``pipeline/secret_formats.toml``), most specific first
FORMATS: tuple[Rule, ...] = _load_formats()


def _url_password(secret: str, keyword: str) -> bool:
    """A URL's password: short ones count (``pw9``), placeholders do not (``password``,
    ``${DB_PASSWORD}``, ``<pass>``, ``xxx``)."""
    return len(secret) >= 3 and not literal.placeholder(secret)


def _basic(secret: str, keyword: str) -> bool:
    """A Basic credential decodes to ``user:password`` with a real password."""
    try:
        raw = base64.b64decode(secret + "=" * (-len(secret) % 4), validate=True)
    except binascii.Error:
        return False
    _, colon, password = raw.decode("latin-1").partition(":")
    return bool(colon) and len(password) >= 3 and not literal.placeholder(password)


def _literal(secret: str, keyword: str) -> bool:
    return literal.secret(secret, quoted=True)


#: credentials known by where they stand
CONTEXT_RULES: tuple[Rule, ...] = (
    Rule(
        "url-password",
        "url-password",
        "sgme",
        ("://",),
        r"://(?:[^\s:/@\"'`<>]{0,256}(?:@[^\s:/@\"'`<>]+)?)?:(?P<secret>[^\s@/\"'`<>]{1,256})@"
        r"(?=[A-Za-z0-9\[._-])",
        keep=_url_password,
        what="the password in a URL (scheme://user:password@host, an empty or e-mail user too)",
    ),
    Rule(
        "bearer-token",
        "bearer-token",
        "sgme",
        ("bearer", "token ", "ntlm", "negotiate"),
        r"(?i:bearer|token|ntlm|negotiate)[ \t]+(?P<secret>[A-Za-z0-9._~+/-]{20,}=*)"
        r"(?![A-Za-z0-9._~+/=-])",
        keep=_literal,
        what="the credential of an Authorization header (Bearer …, token …, NTLM …)",
    ),
    Rule(
        "authorization",
        "bearer-token",
        "sgme",
        ("authorization",),
        r"(?i:authorization)[\"']?[ \t]*[:=][ \t]*[\"']?[ \t]*"
        r"(?!(?i:bearer|basic|token|ntlm|negotiate|digest|aws4|hmac)\b)"
        r"(?P<secret>[A-Za-z0-9._~+/-]{16,}=*)(?![A-Za-z0-9._~+/=-])",
        keep=_literal,
        what="a credential given as an Authorization header without a scheme",
    ),
    Rule(
        "basic-auth",
        "basic-auth",
        "sgme",
        ("basic",),
        r"(?i:basic)[ \t]+(?P<secret>[A-Za-z0-9+/]{8,}={0,2})(?![A-Za-z0-9+/=])",
        keep=_basic,
        what="the credentials of an Authorization: Basic header (base64 of user:password)",
    ),
    Rule(
        "curl-user",
        "password",
        "sgme",
        ("curl",),
        r"curl\b(?:[^\n]|\\\n){0,600}?\s(?:-u|--user|--proxy-user)[ =]?[ \t]*(?P<q>[\"']?)"
        r"[^\s:\"']{0,128}:(?P<secret>[^\s\"']{3,256})(?P=q)",
        keep=_literal,
        what="the password of curl -u user:password",
    ),
    Rule(
        "sql-identified-by",
        "password",
        "sgme",
        ("identified",),
        # quoted, or SQL written in capitals: "identified by Eugene Fama" is prose
        r"(?:(?i:identified)(?:\s+with\s+\S+)?\s+(?i:by)\s+(?P<q>[\"'`])(?P<secret>[^\"'`\n]{3,256})(?P=q)"
        r"|IDENTIFIED(?:\s+WITH\s+\S+)?\s+BY\s+(?P<bare>[^\s\"'`;]{3,256}))",
        keep=_literal,
        what="the password of SQL's IDENTIFIED BY",
    ),
    Rule(
        "securestring",
        "password",
        "sgme",
        ("convertto-securestring",),
        r"(?i:convertto-securestring)(?:\s+-(?i:string|asplaintext|force))*\s+\\?(?P<q>[\"']?)"
        r"(?P<secret>[^\s\"'\\]{4,256})\\?(?P=q)",
        keep=_literal,
        what="the string given to PowerShell's ConvertTo-SecureString",
    ),
    Rule(
        "azure-account-key",
        "azure-storage-key",
        "sgme",
        ("accountkey=", "sharedaccesskey="),
        r"(?i:AccountKey|SharedAccessKey)=(?P<secret>[A-Za-z0-9+/]{40,}={0,2})",
        keep=_literal,
        what="the key of an Azure connection string (AccountKey=…, SharedAccessKey=…)",
    ),
)

#: the words of a secret's name; where one stands, :func:`assignment.read` reads the name
NAME_WORDS = (
    *("pass", "pw", "pswd", "pssw", "pswr", "pswo", "pasw"),
    *("secret", "token", "credential", "key", "bearer"),
)
_ASSIGNMENT = -1
_RULES: tuple[Rule, ...] = (*FORMATS, *CONTEXT_RULES)


class _Keywords(Protocol):
    """What :func:`scan` needs of its keyword search (``ahocorasick.Automaton``'s calls)."""

    def add_word(self, key: str, value: Any) -> object: ...

    def make_automaton(self) -> None: ...

    def iter(self, text: str) -> Iterator[tuple[int, Any]]: ...


class _Finds:
    """The automaton's search with ``str.find``, one pass a keyword (the Hermes provider's
    copy, without the automaton: it redacts a spooled turn, off any hot path). The same
    matches in the same order: by the index of their last character, a longer keyword first
    where two end together."""

    def __init__(self) -> None:
        self._words: dict[str, Any] = {}

    def add_word(self, key: str, value: Any) -> bool:
        self._words[key] = value
        return True

    def make_automaton(self) -> None:
        return None

    def iter(self, text: str) -> Iterator[tuple[int, Any]]:
        hits: list[tuple[int, int, Any]] = []
        for word, value in self._words.items():
            at = text.find(word)
            while at >= 0:
                hits.append((at + len(word) - 1, -len(word), value))
                at = text.find(word, at + 1)
        hits.sort(key=lambda hit: hit[:2])
        return iter([(last, value) for last, _, value in hits])


def _automaton(*, portable: bool = False) -> _Keywords:
    """Every keyword of every rule, each with the rules it starts (and the assignment
    reading, for a name word); ``portable``: searched with :class:`_Finds`."""
    by_keyword: dict[str, list[int]] = collections.defaultdict(list)
    for number, rule in enumerate(_RULES):
        for keyword in rule.keywords:
            by_keyword[keyword].append(number)
    for word in NAME_WORDS:
        by_keyword[word].append(_ASSIGNMENT)
    automaton: _Keywords = _Finds() if portable or ahocorasick is None else ahocorasick.Automaton()
    for keyword, numbers in by_keyword.items():
        automaton.add_word(keyword, (keyword, tuple(numbers)))
    automaton.make_automaton()
    return automaton


_AUTOMATON = _automaton()
#: lower-cases ASCII only, so offsets in the lowered text are offsets in the text
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def scan(text: str) -> list[Finding]:
    """The secrets in ``text``, in order, none overlapping (where two rules find the same
    characters, the earlier rule wins)."""
    lowered = text.lower()
    if len(lowered) != len(text):  # a character whose lower case is longer: keep offsets
        lowered = text.translate(_ASCII_LOWER)
    candidates: list[tuple[int, Finding]] = []
    searched_to: dict[int, int] = {}
    names_read_to = -1
    for last, (keyword, numbers) in _AUTOMATON.iter(lowered):
        at = last - len(keyword) + 1
        for number in numbers:
            if number == _ASSIGNMENT:
                if at < names_read_to:
                    continue
                found, names_read_to = assignment.read(text, at, last + 1)
                if found is not None:
                    names_read_to = max(names_read_to, found.end)  # a name inside it is its own
                    rule = f"assignment to {found.name}"
                    candidates.append(
                        (len(_RULES), Finding(found.kind, found.start, found.end, rule))
                    )
                continue
            if at < searched_to.get(number, -1):
                continue
            rule = _RULES[number]
            if rule.anywhere:
                searched_to[number] = len(text)
                candidates.extend(
                    (number, Finding(rule.kind, a, b, rule.name))
                    for a, b in rule.find_all(text, keyword)
                )
                continue
            hit = rule.find(text, at, keyword)
            if hit is not None:
                searched_to[number] = hit[0]
                candidates.append((number, Finding(rule.kind, hit[1], hit[2], rule.name)))
    if not candidates:
        return []
    candidates.sort(key=lambda c: (_tier(c[0]), c[1].start, c[1].start - c[1].end, c[0]))
    return _kept(text, (f for _, f in candidates))


_CONTEXT_TIER = len(FORMATS)


def _tier(number: int) -> int:
    """Formats first, then context rules, then assignments; within one, leftmost-longest."""
    return 0 if number < _CONTEXT_TIER else 1 if number < len(_RULES) else 2


def _kept(text: str, candidates: Iterable[Finding]) -> list[Finding]:
    """The candidates, in order, that overlap neither a marker already in ``text`` (never
    matched again) nor a candidate kept before them. The kept spans stay sorted by start and
    never overlap, so one look at each neighbour decides (a text with many findings stays
    linear)."""
    starts: list[int] = []
    taken: list[Finding] = []
    for found in (Finding("", m.start(), m.end()) for m in MARKER.finditer(text)):
        starts.append(found.start)
        taken.append(found)
    for found in candidates:
        at = bisect.bisect_right(starts, found.start)
        if at and taken[at - 1].end > found.start:
            continue  # the span before it reaches into it
        if at < len(taken) and taken[at].start < found.end:
            continue  # it reaches into the span after it
        starts.insert(at, found.start)
        taken.insert(at, found)
    return [f for f in taken if f.kind]


@dataclasses.dataclass(frozen=True)
class Redacted:
    """Text with its secrets replaced, and how many of each kind were."""

    text: str
    kinds: collections.Counter[str]

    @property
    def count(self) -> int:
        """How many secrets were replaced."""
        return sum(self.kinds.values())


def replace(text: str, found: list[Finding]) -> Redacted:
    """``text`` with each of ``found`` (in order, not overlapping) replaced by its marker."""
    if not found:
        return Redacted(text, collections.Counter())
    parts = []
    position = 0
    for f in found:
        parts.append(text[position : f.start])
        parts.append(marker(f.kind))
        position = f.end
    parts.append(text[position:])
    return Redacted("".join(parts), collections.Counter(f.kind for f in found))


def redact(text: str) -> Redacted:
    """``text`` with every secret :func:`scan` finds replaced by its :func:`marker`."""
    return replace(text, scan(text))


def redact_value(value: str, *, name: str | None = None) -> Redacted:
    """:func:`redact` for a value stored under ``name`` (a metadata key): when the name says
    it is a secret (``db_password``) and the value is a literal, the value is one, whole."""
    kind = None if name is None else assignment.name_kind(name)
    if kind is not None and not MARKER.search(value) and literal.secret(value, quoted=True):
        return Redacted(marker(kind), collections.Counter({kind: 1}))
    return redact(value)


#: every kind a marker may name, in the order the rules run
KINDS: tuple[str, ...] = tuple(
    dict.fromkeys(
        [*(r.kind for r in _RULES), "password", "aws-secret-key", "api-key", "token", "secret"]
    )
)
