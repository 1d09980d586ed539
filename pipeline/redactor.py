"""Credentials of well-known forms, found in text and replaced by ``[REDACTED:<kind>]``.

Pure: text in, text out; no I/O, nothing of ours imported. The rule set is ours and written
down here, one :class:`Rule` per kind (docs/privacy.md lists them and says why no detection
library is used): each rule matches a credential by its *form* — a vendor's prefix and
length (``AKIA…``, ``ghp_…``, ``sk-proj-…``), a structure (a PEM private key block, a JWT's
three base64url parts, the password of ``scheme://user:password@host``), or a value assigned
to a name that says it is one (``DB_PASSWORD=…``, ``"api_key": "…"``, ``--token …``).

Precision matters as much as recall: transcripts are full of code, hashes, UUIDs, base64
blobs and commit ids, and every one of them must come back as it was sent. So there is no
entropy guess anywhere: a 40-character hex string is a commit id, not a secret, and a long
base64 run is data unless its form or its name says otherwise. An assignment counts only when
its value is a literal (quoted, or the unquoted value of an env/YAML/INI line or a CLI flag),
not an expression (``token = self.token``, ``password = getpass()``) nor a placeholder
(``${DB_PASSWORD}``, ``<your-key>``, ``***``).

Redacting is idempotent: a marker is never matched again, so text redacted twice (a transcript
imported, then captured) comes out the same.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import string
from collections.abc import Callable, Iterable

MARKER_PREFIX = "[REDACTED:"


def marker(kind: str) -> str:
    """What a secret of ``kind`` is replaced by."""
    return f"{MARKER_PREFIX}{kind}]"


#: a marker in text (what is never matched again)
MARKER = re.compile(r"\[REDACTED:[a-z0-9-]+\]")


@dataclasses.dataclass(frozen=True)
class Rule:
    """One kind of credential: ``pattern`` finds it; the group named ``secret`` (or the whole
    match) is what is replaced; ``keep`` may refuse a match (a placeholder, an expression)."""

    kind: str
    pattern: re.Pattern[str]
    keep: Callable[[str], bool] | None = None
    #: literals, in lower case, one of which every match contains (whatever its case): text
    #: with none of them is not searched
    needles: tuple[str, ...] = ()
    what: str = ""  #: for docs/privacy.md: what the rule matches

    def span(self, match: re.Match[str]) -> tuple[int, int]:
        """Where the secret is in a match."""
        if "secret" in self.pattern.groupindex and match.group("secret") is not None:
            return match.span("secret")
        return match.span()


# ---------------------------------------------------------------------------------------------
# values: what a literal secret looks like, and what a placeholder or an expression does

#: values that stand for a secret without being one: shell and template variables, <angle>
#: placeholders, masks, and words people write where the value goes
_PLACEHOLDER = re.compile(
    r"""(?ix)
    ^(?:
        [$%@]\{?.*            # $VAR ${VAR} %(name)s @var
      | \{\{?.*\}\}?          # {{ var }} {var}
      | <.*                   # <your-api-key>, <generate one>
      | [*x•#.]{3,}           # *** xxxx ...
      | (?:your|my|the)[-_ ]?[\w-]*
      | \w*(?:placeholder|example|redacted|dummy|changeme|xxxx)\w*
      | (?:none|null|nil|true|false|undefined|empty|required|optional|string|str|bytes|int)
      | (?:secret|password|passwd|token|key|pass|pwd)
    )$
    """
)
#: an unquoted value that is code, not a literal: a call, an attribute, an index, an operator
_EXPRESSION = re.compile(r"[()\[\]]|^[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)+$|^(?:await|self|os)\b")
_IDENTIFIER_VALUE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TYPE_ANNOTATION = re.compile(
    r"^(?:Optional|Union|List|Dict|Annotated|Secret\w*|SecretStr|typing\.)\b|^[A-Za-z_]\w*\s*[|=]"
)


def _literal(value: str) -> bool:
    """Whether a value assigned to a secret's name is a secret: long enough, not a
    placeholder, not a marker already."""
    value = value.strip()
    if len(value) < 6 or value.startswith(MARKER_PREFIX):
        return False
    return _PLACEHOLDER.match(value) is None


def _unquoted_literal(value: str) -> bool:
    """:func:`_literal` for an unquoted value, which may be code rather than a literal."""
    value = value.strip()
    if _EXPRESSION.search(value) or _TYPE_ANNOTATION.match(value):
        return False
    # one word of letters alone is more often an identifier than a password (``token: str``),
    # and one shaped like a variable is one (``cache_token = current_token``)
    if value.isalpha() and value.islower() and len(value) < 12:
        return False
    if _IDENTIFIER_VALUE.fullmatch(value) and _code_name(value):
        return False
    return _literal(value)


def _code_name(value: str) -> bool:
    """Whether an identifier-shaped value reads as a name in code: ``snake_case``,
    ``UPPER_CASE``, ``camelCase`` — not a random mix of cases and digits."""
    if "_" in value and (value == value.lower() or value == value.upper()):
        return True
    if any(c.isdigit() for c in value):
        return False
    upper = sum(c.isupper() for c in value)
    return value[0].islower() and upper * 4 <= len(value)


def _url_password(value: str) -> bool:
    return _literal(value) or (len(value) >= 3 and _PLACEHOLDER.match(value) is None)


# ---------------------------------------------------------------------------------------------
# the rules

_B = r"(?<![A-Za-z0-9_])"  # no identifier character before
_E = r"(?![A-Za-z0-9_])"  # none after
#: the names whose values are secrets: the last word of the name (``DB_PASSWORD``,
#: ``clientSecret``, ``x-api-key``), never ``tokens``, ``token_type`` or ``key`` alone
_NAME = (
    r"[A-Za-z0-9_.-]*?(?:password|passwd|passphrase|pwd|pass|secret|token|credentials?"
    r"|api[_-]?key|access[_-]?key|secret[_-]?key|private[_-]?key|auth[_-]?key|account[_-]?key"
    r"|signing[_-]?key|encryption[_-]?key|master[_-]?key|client[_-]?secret)"
)


def _password_kind(name: str) -> str:
    lowered = name.lower()
    if "secret" in lowered and ("aws" in lowered or "access" in lowered):
        return "aws-secret-key"
    if re.search(r"pass|pwd", lowered):
        return "password"
    if "token" in lowered:
        return "token"
    if "key" in lowered:
        return "api-key"
    return "secret"


def _rule(
    kind: str, pattern: str, needles: str | tuple[str, ...], what: str, flags: int = 0
) -> Rule:
    found = (needles,) if isinstance(needles, str) else needles
    return Rule(
        kind, re.compile(pattern, flags), needles=tuple(n.lower() for n in found), what=what
    )


#: credentials known by their form, most specific first
FORM_RULES: tuple[Rule, ...] = (
    _rule(
        "private-key",
        # a PEM block, also inside a JSON string (\n escaped), to its END line or, cut
        # short, to the end of its base64
        r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----"
        r"(?:(?:(?!-----END)[\s\S]){0,20000}?-----END[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----"
        r"|(?:[A-Za-z0-9+/=\r\n]|\\n|\\r){0,20000})",
        "PRIVATE KEY",
        "a PEM private key block (RSA, EC, DSA, OpenSSH, PGP, PKCS#8, encrypted), whole",
    ),
    _rule(
        "aws-access-key",
        _B + r"(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[A-Z0-9]{16}" + _E,
        ("AKIA", "ASIA", "ABIA", "ACCA", "A3T"),
        "an AWS access key id (AKIA…, ASIA…: 20 characters)",
    ),
    _rule(
        "github-token",
        _B + r"(?:(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{36}|github_pat_[A-Za-z0-9_]{82})" + _E,
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
        "a GitHub token (ghp_, gho_, ghu_, ghs_, ghr_, github_pat_)",
    ),
    _rule(
        "gitlab-token",
        _B + r"gl(?:pat|dt|rt|ptt|cbt|oas)-[A-Za-z0-9_-]{20,}" + _E,
        "gl",
        "a GitLab token (glpat-, gldt-, glrt-, …)",
    ),
    _rule(
        "slack-webhook",
        r"https://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9/_-]{20,}",
        "hooks.slack.com",
        "a Slack incoming webhook URL",
    ),
    _rule(
        "slack-token",
        _B + r"xox[abposre]-(?:[0-9]+-)?[A-Za-z0-9-]{10,}" + _E,
        "xox",
        "a Slack token (xoxb-, xoxp-, xoxa-, …)",
    ),
    _rule(
        "anthropic-key",
        _B + r"sk-ant-(?:api|admin|oat)[0-9]{2}-[A-Za-z0-9_-]{40,}" + _E,
        "sk-ant-",
        "an Anthropic API key (sk-ant-…)",
    ),
    _rule(
        "openai-key",
        _B
        + r"sk-(?:(?:proj|svcacct|admin|None)-[A-Za-z0-9_-]{20,}"
        + r"|[A-Za-z0-9]{20}T3BlbkFJ[A-Za-z0-9]{20}|[A-Za-z0-9]{48})"
        + _E,
        "sk-",
        "an OpenAI API key (sk-proj-…, sk-svcacct-…, sk- and 48 characters)",
    ),
    _rule(
        "stripe-key",
        _B + r"(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}|whsec_[A-Za-z0-9]{24,}" + _E,
        "_",
        "a Stripe secret or restricted key (sk_live_, rk_test_, …) or webhook secret (whsec_)",
    ),
    _rule(
        "google-api-key",
        _B + r"AIza[0-9A-Za-z_-]{35}" + _E,
        "AIza",
        "a Google API key (AIza…)",
    ),
    _rule(
        "google-oauth-token",
        _B + r"ya29\.[0-9A-Za-z_-]{20,}" + _E,
        "ya29.",
        "a Google OAuth access token (ya29.…)",
    ),
    _rule(
        "huggingface-token",
        _B + r"hf_[A-Za-z0-9]{34,}" + _E,
        "hf_",
        "a Hugging Face token (hf_…)",
    ),
    _rule("npm-token", _B + r"npm_[A-Za-z0-9]{36}" + _E, "npm_", "an npm token (npm_…)"),
    _rule(
        "pypi-token",
        _B + r"pypi-AgEIcHlwaS5vcmc[A-Za-z0-9_-]{50,}" + _E,
        "pypi-",
        "a PyPI upload token (pypi-AgEIcHlwaS5vcmc…)",
    ),
    _rule(
        "sendgrid-key",
        _B + r"SG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}" + _E,
        "SG.",
        "a SendGrid API key (SG.….…)",
    ),
    _rule(
        "twilio-key",
        _B + r"SK[0-9a-f]{32}" + _E,
        "SK",
        "a Twilio API key SID (SK and 32 hex digits)",
    ),
    _rule(
        "mailgun-key",
        _B + r"key-[0-9a-f]{32}" + _E,
        "key-",
        "a Mailgun API key (key- and 32 hex digits)",
    ),
    _rule(
        "telegram-bot-token",
        _B + r"[0-9]{8,10}:AA[A-Za-z0-9_-]{33}" + _E,
        ":AA",
        "a Telegram bot token (digits:AA…)",
    ),
    _rule(
        "shopify-token",
        _B + r"shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}" + _E,
        "shp",
        "a Shopify access token (shpat_, shpca_, shppa_, shpss_)",
    ),
    _rule(
        "digitalocean-token",
        _B + r"do[opr]_v1_[a-f0-9]{64}" + _E,
        "_v1_",
        "a DigitalOcean token (dop_v1_, doo_v1_, dor_v1_)",
    ),
    _rule(
        "sgme-token",
        _B + r"sgme_[A-Za-z0-9_-]{43}" + _E,
        "sgme_",
        "an SGME L0 bearer token (sgme_…)",
    ),
    _rule(
        "azure-storage-key",
        r"(?i:AccountKey|SharedAccessKey)=(?P<secret>[A-Za-z0-9+/]{40,}={0,2})",
        "key=",
        "the key of an Azure connection string (AccountKey=…, SharedAccessKey=…)",
    ),
    _rule(
        "jwt",
        _B + r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}" + _E,
        "eyJ",
        "a JSON Web Token (three base64url parts, header and claims both JSON)",
    ),
)

#: credentials known by where they stand
CONTEXT_RULES: tuple[Rule, ...] = (
    Rule(
        "url-password",
        re.compile(
            r"(?i)\b[a-z][a-z0-9+.-]{1,30}://[^\s:/@\"'`<>]{1,256}:(?P<secret>[^\s@/\"'`<>]{1,256})@"
            r"(?=[A-Za-z0-9\[._-])"
        ),
        keep=_url_password,
        needles=("://",),
        what="the password in a URL or connection string (scheme://user:password@host)",
    ),
    Rule(
        "bearer-token",
        re.compile(
            r"(?i)\b(?:authorization|proxy-authorization)[\"']?\s*[:=]\s*[\"']?(?:bearer|token)"
            r"\s+(?P<secret>[A-Za-z0-9._~+/=-]{12,})"
        ),
        keep=_literal,
        needles=("auth",),
        what="the credential of an Authorization header (Bearer …, token …)",
    ),
    Rule(
        "basic-auth",
        re.compile(
            r"(?i)\b(?:authorization|proxy-authorization)[\"']?\s*[:=]\s*[\"']?basic"
            r"\s+(?P<secret>[A-Za-z0-9+/]{8,}={0,2})"
        ),
        keep=_literal,
        needles=("basic",),
        what="the credentials of an Authorization: Basic header",
    ),
)

#: the last word of a secret's name; the regex starts at it (a scan for a few letters is fast)
#: and the whole name is read backwards from it (:func:`_name_before`)
_KEYWORD = r"(?:pass(?:word|wd|phrase)?|pwd|secret|token|credentials?|key)"
_NAME_RULE = re.compile(_NAME, re.IGNORECASE)
_IDENTIFIER = frozenset(string.ascii_letters + string.digits + "_.-")
#: the keyword, then the value in one of the forms below
_ASSIGN = re.compile(
    r"""(?ix)
    (?P<kw>"""
    + _KEYWORD
    + r""")(?![A-Za-z0-9])
    (?:
        ["']?\s*[:=]\s*(?P<q>["'`])(?P<quoted>[^"'`\n\\]{1,512})(?P=q)    # name = "value"
      | ["']?[ \t]*[:=][ \t]*(?P<bare>[^\s"'`,;&]{1,512})(?=[\s,;&]|$)  # NAME=value, name: v
    )
    """
)


_RULES = (*FORM_RULES, *CONTEXT_RULES)

#: a word in every name :data:`_ASSIGN` and :data:`_FLAG` match (their regexes are
#: case-insensitive alternations, tried at every character: a few times the rest of a scan)
_NAME_WORDS = ("pass", "pwd", "secret", "token", "credential", "key")


def _name_before(text: str, end: int) -> str:
    """The identifier that ends at ``end`` (``DB_PASSWORD`` from its keyword's end)."""
    start = end
    while start > 0 and end - start < 200 and text[start - 1] in _IDENTIFIER:
        start -= 1
    return text[start:end]


_FLAG = re.compile(
    r"(?i)(?<![\w-])--?(?P<name>" + _NAME + r")(?:[ =])"
    r"(?:(?P<q>[\"'])(?P<quoted>[^\"'\n]{1,512})(?P=q)|(?P<bare>[^\s\"'`]{1,512}))"
)


@dataclasses.dataclass(frozen=True)
class Finding:
    """One secret found: its kind and where it is (character offsets)."""

    kind: str
    start: int
    end: int


def _word_starts(lowered: str) -> list[int]:
    """Where each of :data:`_NAME_WORDS` begins in ``lowered``, in order: the only places an
    :data:`_ASSIGN` match can begin."""
    found = set()
    for word in _NAME_WORDS:
        at = lowered.find(word)
        while at >= 0:
            found.add(at)
            at = lowered.find(word, at + 1)
    return sorted(found)


def _dash_starts(text: str) -> list[int]:
    """Where a run of ``-`` begins: the only places a :data:`_FLAG` match can begin."""
    found = []
    at = text.find("-")
    while at >= 0:
        if at == 0 or text[at - 1] != "-":
            found.append(at)
        at = text.find("-", at + 1)
    return found


def _matches(
    pattern: re.Pattern[str], text: str, starts: list[int] | None
) -> Iterable[re.Match[str]]:
    """``pattern.finditer(text)``; with ``starts`` (every place a match can begin), tried
    there only: these regexes are case-insensitive alternations, slow to try everywhere."""
    if starts is None:
        yield from pattern.finditer(text)
        return
    end = 0
    for at in starts:
        if at >= end and (m := pattern.match(text, at)) is not None:
            yield m
            end = m.end()


def _assignments(text: str, words: list[int] | None = None) -> Iterable[Finding]:
    """Values assigned to names that say they are secrets. ``words``: where the name words
    begin (:func:`_word_starts`, when ``text`` is ASCII: lowering keeps its positions); the
    regexes are then tried only where a match can begin."""
    for m in _matches(_FLAG, text, None if words is None else _dash_starts(text)):
        yield from _assigned(m, m.group("name"), flag=True)
    for m in _matches(_ASSIGN, text, words):
        name = _name_before(text, m.end("kw"))
        if _NAME_RULE.fullmatch(name):
            yield from _assigned(m, name)


#: what may follow an unquoted value on its line: nothing, a comment, a separator (an
#: operator or another operand means the value was part of an expression)
_AFTER_BARE = ("#", "//", "&", ";", ",", ")", "}", "]")


def _assigned(m: re.Match[str], name: str, *, flag: bool = False) -> Iterable[Finding]:
    if m.group("quoted") is not None:
        value, span, ok = m.group("quoted"), m.span("quoted"), _literal
    else:
        value, span, ok = m.group("bare"), m.span("bare"), _unquoted_literal
        end = m.string.find("\n", span[1])
        rest = m.string[span[1] : None if end < 0 else end].strip()
        if rest and not flag and not rest.startswith(_AFTER_BARE):
            return
    if ok(value):
        yield Finding(_password_kind(name), *span)


def _searched(rule: Rule, lowered: str) -> bool:
    """Whether ``rule``'s regex may match: one of its needles is in the lowered text (a
    plain loop, not ``any``: a scan asks this of every rule, and most say no)."""
    if not rule.needles:
        return True
    for needle in rule.needles:  # noqa: SIM110 - any() of a generator: twice the time
        if needle in lowered:
            return True
    return False


def _found(rule: Rule, text: str) -> Iterable[Finding]:
    for m in rule.pattern.finditer(text):
        start, end = rule.span(m)
        if end > start and (rule.keep is None or rule.keep(text[start:end])):
            yield Finding(rule.kind, start, end)


def scan(text: str) -> list[Finding]:
    """The secrets in ``text``, in order, none overlapping (where two rules match the same
    characters, the earlier rule — the more specific — wins)."""
    lowered = text.lower()
    candidates: list[Finding] = []
    for rule in _RULES:
        if _searched(rule, lowered):
            candidates.extend(_found(rule, text))
    if "=" in text or ":" in text or "-" in text:
        if not text.isascii():  # lowering is not the regexes' case-folding: tried everywhere
            candidates.extend(_assignments(text))
        elif words := _word_starts(lowered):  # no name word, no assignment of a secret
            candidates.extend(_assignments(text, words))
    return _kept(text, candidates)


def _kept(text: str, candidates: Iterable[Finding]) -> list[Finding]:
    """The candidates, in order, that overlap neither a marker already in ``text`` (never
    matched again) nor a candidate kept before them."""
    taken = [Finding("", m.start(), m.end()) for m in MARKER.finditer(text)]
    for found in candidates:
        if all(found.end <= t.start or found.start >= t.end for t in taken):
            taken.append(found)
    return sorted((f for f in taken if f.kind), key=lambda f: f.start)


@dataclasses.dataclass(frozen=True)
class Redacted:
    """Text with its secrets replaced, and how many of each kind were."""

    text: str
    kinds: collections.Counter[str]

    @property
    def count(self) -> int:
        """How many secrets were replaced."""
        return sum(self.kinds.values())


def redact(text: str) -> Redacted:
    """``text`` with every secret :func:`scan` finds replaced by its :func:`marker`."""
    found = scan(text)
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


#: every kind a marker may name, in the order the rules run
KINDS: tuple[str, ...] = (
    *(r.kind for r in FORM_RULES),
    *(r.kind for r in CONTEXT_RULES),
    "password",
    "aws-secret-key",
    "api-key",
    "token",
    "secret",
)
