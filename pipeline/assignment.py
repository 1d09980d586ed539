"""A value assigned to a name that says it is a secret, read the way the text's own grammar
reads it.

Pure: text in, spans out; of ours, only :mod:`pipeline.literal` imported.
:mod:`pipeline.redactor` finds where a word of a secret's name occurs (``password``,
``token``, ``secret``, …) and asks :func:`read` what is assigned there. The syntaxes read,
each a real one met in transcripts:

* ``NAME=value`` — env files, shell (``export``, ``env NAME=… cmd``, ``PGPASSWORD=… psql``,
  ``docker run -e NAME=…``): an unquoted value runs to the end of its shell word, so
  ``password=Tr0ub4dor&3-horse`` and ``REDIS_PASSWORD=Hunter2,Hunter3`` are taken whole; in a
  URL query (``?token=…&next=…``) it ends at ``&``;
* ``name = "v"``, ``name: v``, ``"name": "v"``, ``name := "v"``, ``name => "v"``, ``name ?= "v"``,
  comparisons (``if (password !== "v")``, ``"v" == password``), ``#define name "v"``,
  ``name "v"`` (SQL ``WITH PASSWORD 'v'``, RPM ``%define``), ``f(name="v")``,
  ``setProperty("NAME", "v")``, ``name('v')`` (SQL ``PASSWORD('v')``), CLI flags
  (``--password v``, ``-Password 'v'``, ``-passin pass:v``), XML (``<password>v</password>``,
  ``<add key="Password" value="v"/>``);
* Markdown escapes in a name (``SECRET\\_KEY``) are read through.

A label that names a secret never hides the value after it: every occurrence of a name word is
read on its own, so in ``the secret: aws_secret_access_key = …`` the first reading (``secret:``
followed by a name) finds nothing and the second finds the key.

Whether a value read there is a secret — a literal, not code or a placeholder — is
:mod:`pipeline.literal`'s to say.
"""

from __future__ import annotations

import dataclasses
import re

from . import literal  # relative: the Hermes provider runs a copy (redactor.py)

#: the words that end a secret's name (lower case), and the kind each makes
_WORDS = {
    "password": "password",
    "passwd": "password",
    "passphrase": "password",
    "pass": "password",
    "pwd": "password",
    "pw": "password",
    "pswd": "password",
    "secret": "secret",
    "token": "token",
    "credential": "secret",
    "credentials": "secret",
    "apikey": "api-key",
    "bearer": "token",
    "passwords": "password",
    "passin": "password",
    "passout": "password",
    # misspellings met in real configurations
    "psswd": "password",
    "pswrd": "password",
    "psword": "password",
    "psswrd": "password",
    "pssword": "password",
    "paswd": "password",
    "pasword": "password",
    "paswrd": "password",
}
#: the words before ``key`` that make it a secret's name (``api_key``, ``secretKey``, …)
_KEY_WORDS = frozenset(
    {
        "api",
        "access",
        "secret",
        "private",
        "auth",
        "account",
        "signing",
        "encryption",
        "master",
        "client",
        "app",
        "license",
        "shared",
        "session",
        "storage",
        "service",
    }
)
#: words that may follow a secret's name word and keep it one (``password_confirmation``)
_SUFFIXES = frozenset(
    {
        "confirmation",
        "confirm",
        "secure",
        "sec",
        "value",
        "val",
        "plain",
        "plaintext",
        "cleartext",
        "raw",
        "base",
        "old",
        "new",
        "str",
        "string",
        "literal",
    }
)
#: words that make a name not a secret's, wherever they stand before its last word
#: (``csrf_token``, ``publicToken``, ``authenticity_token``, ``password_reset_token``)
_NOT_SECRET = frozenset(
    {
        "csrf",
        "xsrf",
        "authenticity",
        "nonce",
        "public",
        "publishable",
        "pub",
        "reset",
        "verification",
        "verify",
        "confirmation",
        "invite",
        "unsubscribe",
        "page",
        "next",
        "cursor",
        "pagination",
        "continuation",
        "sync",
        "cancellation",
        "idempotency",
        "request",
        "device",
        "registration",
        "push",
        "fcm",
        "apns",
    }
)
_IDENT = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
_WORD_SPLIT = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


@dataclasses.dataclass(frozen=True)
class Assigned:
    """A literal secret assigned to ``name``: its kind and where it is."""

    kind: str
    start: int
    end: int
    name: str


def name_kind(name: str) -> str | None:
    """The kind of secret ``name`` says its value is, or None when it says none
    (``DB_PASSWORD`` → password, ``clientSecret`` → secret, ``api-key`` → api-key;
    ``token_type``, ``max_tokens``, ``key``, ``password_hash`` → None)."""
    words = [w.lower() for w in _WORD_SPLIT.findall(name.replace("\\", ""))]
    while len(words) > 1 and (words[-1] in _SUFFIXES or words[-1].isdigit()):
        words.pop()
    if not words:
        return None
    if _NOT_SECRET.intersection(words[:-1]):
        return None
    last = words[-1]
    if last == "key":
        if len(words) > 1 and words[-2] in _KEY_WORDS:
            if "secret" in words and ("access" in words or "aws" in words):
                return "aws-secret-key"  # aws_secret_access_key, SecretAccessKey
            return "api-key"
        return None
    kind = _WORDS.get(last) or _run_together(last, upper=name.isupper())
    if kind == "secret" and "aws" in words and "access" in words:
        return "aws-secret-key"
    if last == "pw" and len(words) > 2:  # ``user_pw`` yes, ``upper_bound_pw_ratio`` no
        return None
    return kind


#: words that end a name written as one word (``PGPASSWORD``, ``authtoken``, ``clientsecret``)
_ENDINGS = (
    ("password", "password"),
    ("passwd", "password"),
    ("passphrase", "password"),
    ("pwd", "password"),
    ("secret", "secret"),
    ("token", "token"),
    ("apikey", "api-key"),
    ("accesskey", "api-key"),
    ("secretkey", "api-key"),
    ("privatekey", "api-key"),
)


def _run_together(word: str, *, upper: bool) -> str | None:
    """The kind of a name whose words run together: ``PGPASSWORD``, ``authtoken``;
    ``MYSQLPASS`` in capitals only (``bypass``, ``compass`` are words)."""
    for ending, kind in _ENDINGS:
        if word.endswith(ending):
            return kind
    if upper and word.endswith("pass") and len(word) > 4:
        return "password"
    return None


# ---------------------------------------------------------------------------------------------
# reading a name and what is assigned to it

_QUOTES = "\"'`"
#: operators between a name and its value, longest first
_OPERATOR = re.compile(r"(?::{1,3}=|\?=|\.=|\+=|=>|!==|===|!=|==|=~|->|=|:(?!:)|,)")
_VALUE_PREFIX = re.compile(r"(?:@|[rbuf]{1,2}(?=[\"'])|b(?=`))?")
#: what may follow an unquoted value of code or YAML on its line (else it was an expression)
_AFTER = ("#", "//", "--", "/*", "<!--", ";", ",", ")", "}", "]", "&&", "||", "\\")
_CLOSERS = {")": "(", "]": "[", "}": "{"}
#: another ``name:value`` or ``name=value`` pair after a value (``password:x username:y``)
_TYPED = re.compile(r"[ \t]*[A-Za-z_][\w.]*(?:\[[\w., ]*\]|<[\w., ]*>)?[?!]?[ \t]*=(?!=)")
_TWO_WORDS = re.compile(r"(?<![\w.-])([A-Za-z]+) $")
_PAIR = re.compile(r"[A-Za-z_][\w.-]{0,40}[:=][^\s=:]")


def _name_bounds(text: str, start: int, end: int) -> tuple[int, int]:
    """The identifier around ``text[start:end]``, Markdown escapes (``\\_``) included."""
    a = start
    while a > 0 and (text[a - 1] in _IDENT or (text[a - 1] == "\\" and text[a] in "_-*")):
        a -= 1
    b = end
    n = len(text)
    while b < n and (text[b] in _IDENT or (text[b] == "\\" and b + 1 < n and text[b + 1] in "_-*")):
        b += 1
    while b > end and text[b - 1] in ".-":  # a name does not end with a sentence's full stop
        b -= 1
    return a, b


#: how far around a name its line is read (a minified file is one long line: each name is
#: read within this window, so a scan stays linear in the text)
WINDOW = 2048  #: characters


def _line(text: str, at: int) -> tuple[int, int]:
    """The name's line, at most :data:`WINDOW` characters to each side."""
    low = max(0, at - WINDOW)
    start = text.rfind("\n", low, at) + 1 or low
    end = text.find("\n", at, at + WINDOW)
    return start, min(len(text), at + WINDOW) if end < 0 else end


#: the longest value read after a name; a longer one is not read at all (a long token has a
#: form of its own: a JWT, a PEM block; and a bound keeps a scan linear in the text)
MAX_VALUE = 512  #: characters
_WORD = re.compile(rf"\S{{1,{MAX_VALUE}}}(?!\S)")
_QUOTED = {q: re.compile(rf"{q}((?:[^{q}\\\n]|\\.){{0,{MAX_VALUE}}}){q}") for q in _QUOTES}


def _quoted(text: str, at: int, line_end: int) -> tuple[int, int] | None:
    """The span inside the quoted string that opens at ``at`` (on its line, escapes honoured,
    at most :data:`MAX_VALUE` characters; the line may go on past the window it was read in)."""
    del line_end
    quote = text[at]
    if text.startswith(quote * 3, at):
        close = text.find(quote * 3, at + 3, at + 3 + MAX_VALUE)
        return None if close < 0 or "\n" in text[at:close] else (at + 3, close)
    m = _QUOTED[quote].match(text, at)
    return None if m is None else m.span(1)


def _word(text: str, at: int, line_end: int) -> tuple[int, int]:
    """The shell word that starts at ``at``: up to whitespace (empty when longer than
    :data:`MAX_VALUE` characters: not read)."""
    del line_end
    m = _WORD.match(text, at)
    return (at, at) if m is None else m.span()


def _trim(text: str, line_start: int, name_start: int, a: int, b: int) -> tuple[int, int]:
    """An unquoted value without what belongs to its surroundings: a closing quote or
    bracket opened before the name, a trailing separator."""
    before = text[line_start:name_start]
    while b > a:
        c = text[b - 1]
        if c in ",;" or (c in _QUOTES and c in before):
            b -= 1
        elif c in _CLOSERS:
            value = text[a:b]
            if value.count(c) > value.count(_CLOSERS[c]):
                b -= 1
            else:
                break
        else:
            break
    return a, b


def read(text: str, start: int, end: int) -> tuple[Assigned | None, int]:
    """The literal secret assigned to the name in which ``text[start:end]`` (a word of a
    secret's name) stands, or None; and where that name ends (the next word to read is
    after it)."""
    name_start, name_end = _name_bounds(text, start, end)
    name = text[name_start:name_end]
    kind = name_kind(name.lstrip("-$@%."))
    if kind is None and name.lower() == "key":  # two words: SECRET KEY: v, access key = v
        before = _TWO_WORDS.search(text, max(0, name_start - 40), name_start)
        if before is not None:
            kind = name_kind(before.group(1) + "_key")
    if kind is None:
        return None, name_end
    line_start, line_end = _line(text, name_start)
    span = _forward(text, name_start, name_end, line_start, line_end)
    if span is None:
        span = _backward(text, name_start, line_start)
    if span is None:
        return None, name_end
    return Assigned(kind, span[0], span[1], name.replace("\\", "")), name_end


def _forward(
    text: str, name_start: int, name_end: int, line_start: int, line_end: int
) -> tuple[int, int] | None:
    """The value after the name, in whichever syntax follows it."""
    before = text[name_start - 1] if name_start > 0 else ""
    i = name_end
    name_quote = ""
    if i < line_end and text[i] in _QUOTES and before == text[i]:  # "name": …
        name_quote = text[i]
        i += 1
    if text.startswith("\\" + '"', i) or text.startswith("\\'", i):  # \"name\": …
        i += 2
    while i < line_end and text[i] in "])":  # env["NAME"] = …, PASSWORD('v')
        if text[i] == ")":
            break
        i += 1
    if before == "<" and i < line_end:  # <password>v</password>, <password name="x">v</…>
        close = text.find(">", i, line_end)
        if close < 0:
            return None
        a = close + 1
        b = text.find("<", a, line_end)
        name = text[name_start:name_end]
        if b < 0 or text[b : b + 2 + len(name)].lower() != f"</{name}".lower():
            return None
        while a < b and text[a].isspace():
            a += 1
        while b > a and text[b - 1].isspace():
            b -= 1
        return (a, b) if literal.secret(text[a:b], quoted=True) else None
    j = i
    while j < line_end and text[j] in " \t":
        j += 1
    if text.startswith("-", name_start):
        return _flag(text, name_start, j, line_start, line_end)
    if name_quote and text[max(0, name_start - 2) : name_start - 1] == "=":
        return _attribute(text, i, line_end)  # <add key="Password" value="v"/>
    if j < line_end and text[j] == "(":  # PASSWORD('v'), set_password("v")
        k = j + 1
        if k < line_end and text[k] in _QUOTES:
            span = _quoted(text, k, line_end)
            if span and text.startswith(")", span[1] + 1):
                return span if literal.secret(text[span[0] : span[1]], quoted=True) else None
        return None
    op = _OPERATOR.match(text, j)
    if op is None:
        if j > i and j < line_end and text[j] in _QUOTES:  # #define password "v", PASSWORD 'v'
            span = _quoted(text, j, line_end)
            if span and literal.secret(text[span[0] : span[1]], quoted=True):
                return span
        return None
    if op.group() == "," and name_quote not in ("'", '"'):  # not a Markdown `NAME`, `OTHER`
        return None
    k = op.end()
    if op.group() == ":":  # a typed name: val password: String = "v", passwd: str = "v"
        typed = _TYPED.match(text, k)
        if typed is not None:
            k = typed.end()
    shell = op.group() == "=" and k == i + 1 and not name_quote and j == i
    while k < line_end and text[k] in " \t":
        k += 1
    if k >= line_end:
        return None
    k = _VALUE_PREFIX.match(text, k).end()  # type: ignore[union-attr]
    if k >= line_end:  # a prefix and nothing after it: `--api-key=@` at the end of a line
        return None
    if text[k] in _QUOTES:
        span = _quoted(text, k, line_end)
        if span is None:
            return None
        value = text[span[0] : span[1]]
        if (
            op.group() == ","
            and literal.IDENTIFIER.match(value)
            and not any(c.isdigit() for c in value)
        ):
            return None  # get(['calendarAPIKey', 'emailAPIKey']): names listed, not assigned
        return span if literal.secret(value, quoted=True) else None
    if text.startswith(('\\"', "\\'"), k):  # "{\"password\": \"v\"}" inside a string
        close = text.find(text[k : k + 2], k + 2, line_end)
        if close < 0:
            return None
        span = (k + 2, close)
        return span if literal.secret(text[span[0] : span[1]], quoted=True) else None
    if op.group() == ",":  # f("NAME", "value"): only a quoted value is an argument's literal
        return None
    a, b = _word(text, k, line_end)
    if shell and k == op.end():
        if before and before in "?&":  # a URL's query: ?token=v&next=…
            amp = text.find("&", a, b)
            b = amp if amp >= 0 else b
        a, b = _trim(text, line_start, name_start, a, b)
        value = text[a:b]
        in_call = text[line_start:name_start].rstrip().endswith(("(", ","))
        if in_call and (
            literal.EXPRESSION.search(value)
            or (literal.IDENTIFIER.match(value) and literal.code_name(value))
        ):
            return None
        return (
            (a, b)
            if literal.secret(value, quoted=False) or literal.shell_secret(value, in_call)
            else None
        )
    a, b = _trim(text, line_start, name_start, a, b)
    rest = text[b:line_end].strip()
    if rest and not rest.startswith(_AFTER) and not _PAIR.match(rest):
        return None
    return (a, b) if literal.secret(text[a:b], quoted=False) else None


_VALUE_ATTRIBUTE = re.compile(r"\s*value\s*=\s*")


def _attribute(text: str, i: int, line_end: int) -> tuple[int, int] | None:
    """The ``value="…"`` attribute that follows a ``key="NAME"`` or ``name="NAME"`` one."""
    m = _VALUE_ATTRIBUTE.match(text, i)
    if m is None or m.end() >= line_end or text[m.end()] not in _QUOTES:
        return None
    span = _quoted(text, m.end(), line_end)
    if span is None or not literal.secret(text[span[0] : span[1]], quoted=True):
        return None
    return span


def _flag(
    text: str, name_start: int, j: int, line_start: int, line_end: int
) -> tuple[int, int] | None:
    """A command-line flag's value: ``--password v``, ``--token=v``, ``-passin pass:v``."""
    if j < line_end and text[j] in "=:":
        j += 1
    elif j == name_start or not text[j - 1].isspace():
        return None
    if j >= line_end:
        return None
    span = _quoted(text, j, line_end) if text[j] in _QUOTES else _word(text, j, line_end)
    if span is None:
        return None
    a, b = span
    if text.startswith("pass:", a):
        a += 5
    elif text.startswith(("env:", "file:", "fd:", "-"), a):
        return None
    return (a, b) if literal.secret(text[a:b], quoted=text[j] in _QUOTES) else None


_COMPARED = re.compile(r"""(["'`])([^"'`\n]{1,512})\1\s*(?:===|!==|==|!=)\s*$""")


def _backward(text: str, name_start: int, line_start: int) -> tuple[int, int] | None:
    """A literal compared with the name from its left: ``if ("v" == password)``."""
    before = text[max(line_start, name_start - 600) : name_start].rstrip()
    if not before.endswith("="):
        return None  # no comparison operator right before the name
    m = _COMPARED.search(before)
    if m is None:
        return None
    offset = name_start - len(text[max(line_start, name_start - 600) : name_start])
    return (
        (offset + m.start(2), offset + m.end(2))
        if literal.secret(m.group(2), quoted=True)
        else None
    )
