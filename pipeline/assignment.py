"""A value assigned to a name that says it is a secret, read the way the text's own grammar
reads it — and whether that value is a literal secret or only code that stands for one.

Pure: text in, spans out; nothing of ours imported. :mod:`pipeline.redactor` finds where a word
of a secret's name occurs (``password``, ``token``, ``secret``, …) and asks :func:`read` what
is assigned there. The syntaxes read, each a real one met in transcripts:

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

What is not a secret (:func:`literal`): expressions and references (``self.token``,
``args.password``, ``os.environ["X"]``, ``getpass()``, ``$VAR``, ``${VAR}``,
``pass:$smtp_password``), names (``PASSWORD``, ``current_token``), types (``String!``,
``String?``, ``Optional[str]``), paths (``/path/to/key.pem``), URLs and e-mail addresses,
encrypted values (``ENC(…)``, ``!vault``), placeholders (``<your-key>``, ``***``, ``xxxx``,
``changeme``, ``your_password_here``), prompts (``'Password: '``) and single lower-case words
(``credentials: 'include'``, ``'random-secret'``).
"""

from __future__ import annotations

import dataclasses
import re

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
# what a value is


_PLACEHOLDER = re.compile(
    r"""(?ix)
      ^[<\[{(].*[>\]})]$                        # <your-key> [PASSWORD] {token} (value)
    | [$%@]\{\{? \s* [A-Za-z_][\w.:\[\]'" -]* \}   # ${VAR} ${{ secrets.X }} %{var} @{var}
    | \$\([a-z] | ^%\w+%$ | \{\{\s*[\w.\[\]'"| ()-]+?\s*\}\} | \{%   # $(cmd) %VAR% {{ var }}
    | (?-i:\$(?:[a-z_][a-z0-9_]{2,}|[A-Z_][A-Z0-9_]{2,})(?![A-Za-z0-9])) | ^\$\d+$  # $var, $1
    | ^\$[A-Za-z_]\w*$ | \\\( | \#\{                # $SecretAccessKey, Swift \(pw), Ruby #{pw}
    | \*{3} | x{4} | \.{3} | … | •{2} | \#{3}   # masks
    | ^enc\( | ^encrypted: | ^!vault | ^\$ansible_vault | (?-i:^Ag[A-D][A-Za-z0-9+/]{300})
    | ^vault: | ^secret:// | ^arn:aws: | ^ref\+ | ^op://   # references to a store
    | ^(?:my|the|some|a|an|enter|insert|replace|paste|put|add)[-_ ]
    | (?:^|[-_ .])your(?:$|[-_ .A-Z])
    | <[A-Za-z][\w .:/-]*> | ^<|>$                # <token>, <user:password>
    | (?:^|[-_ .])(?:here|example|sample|dummy|fake|placeholder|redacted|changeme|change[-_]me
        |todo|tbd|fixme|none|null|nil|undefined|empty|required|optional|default|insecure
        |unknown)(?:$|[-_ .0-9])
    | ^(?:secret|password|passwd|pass|token|key|apikey|api_key|credentials?|pwd)$
    | (?-i:^[a-z_]*pass(?:word|wd)?$)                # dbpassword, rootpasswd, adminpass
    | ^(?:hunter2|password1?2?3?|passw0rd|p@ssw0rd|p@ssword|letmein|qwerty\d*|abc123|admin123
        |secret123|changeit|test123|foobar|foo|bar|baz|s3cr3t|supersecret|topsecret|mypassword
        |mysecret|mytoken|1234567?8?9?0?)$
    | ^(?:true|false|yes|no|on|off|\d+)$
    """
)
_EXPRESSION = re.compile(
    r"""(?x)
      ^[A-Za-z_$][\w$]*(?:\.[A-Za-z_$][\w$]*)+$     # self.token, args.password, process.env.X
    | ^&?[A-Za-z_$][\w$.:]*\s*[(\[]                  # getpass(), os.environ["X"], Key::new(…)
    | ^(?:await|new|self|this|os|env|process|config|settings|cfg|conf|options|opts|params)\b
    """
)
_TYPE = re.compile(
    r"""(?x)
      ^[A-Z][a-z]+(?:[A-Z][a-z]+)*[!?]?$             # String, String!, String?, SecretStr
    | ^\[?\]?[A-Za-z_][\w.]*(?:<.*>|\[.*\])[!?]?$     # Option<String>, Optional[str], []byte
    | ^(?:str|string|int|bool|bytes|any|object|number|char|&str|\*?\[\]byte)[!?]?$
    """
)
_PATH = re.compile(
    r"""(?ix)
      ^(?:/|\./|\.\./|~/|[a-z]:\\|\\\\|file:)
    | \.(?:pem|key|crt|cer|der|p12|pfx|jks|keystore|json|ini|ya?ml|toml|txt|env|conf|cfg|xml
        |properties|asc|gpg|pub|ppk)$
    | (?-i:^(?:[a-z0-9_.-]*[a-z][a-z0-9_.-]*/)+[a-z0-9_.-]*[a-z][a-z0-9_.-]*$)  # kv/data/prod
    """
)
_URL_OR_MAIL = re.compile(r"(?i)^[a-z][a-z0-9+.-]*://|^[\w.+-]+@[\w-]+\.[\w.-]+$")
_WORD_ONLY = re.compile(r"^[a-z]+(?:[-_][a-z]+)*$")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _code_name(value: str) -> bool:
    """Whether an identifier reads as a name in code: ``snake_case``, ``UPPER_CASE``,
    ``camelCase``, ``PASSWORD`` — not a random mix of cases and digits."""
    if not any(c.isdigit() for c in value) and (value.isupper() or value.islower()):
        return True
    if "_" in value and (value == value.lower() or value == value.upper()):
        return True
    if any(c.isdigit() for c in value):
        return False
    upper = sum(c.isupper() for c in value)
    return value[0].islower() and upper * 4 <= len(value)


def placeholder(value: str) -> bool:
    """Whether ``value`` stands for a secret without being one (``<password>``, ``${PW}``,
    ``xxxx``, ``changeme``, ``password``, …)."""
    return bool(_PLACEHOLDER.search(value.strip())) or len(set(value)) < 3


def literal(value: str, *, quoted: bool) -> bool:
    """Whether ``value``, assigned to a secret's name, is a secret: long enough, and not a
    placeholder, a reference, a type, a path, an encrypted value or (unquoted) code."""
    value = value.strip().replace("\\_", "_")  # a Markdown escape: \_password is _password
    if len(value) < 6 or value.startswith("[REDACTED:") or not _varied(value):
        return False
    if _PLACEHOLDER.search(value) or _PATH.search(value) or _URL_OR_MAIL.search(value):
        return False
    if value.endswith(":") or value.endswith(": ") or value.endswith("?"):
        return False  # a prompt: 'Password: '
    if _WORD_ONLY.match(value):  # 'include', 'random-secret', "real_key", api-key: words
        return False
    if quoted:
        if _IDENTIFIER.match(value) and _code_name(value):  # 'SECRET_KEY', "authToken"
            return False
        # a passphrase has three words or more; two are prose ("my secret")
        return " " not in value or len(value.split()) >= 3
    if _EXPRESSION.search(value) or _TYPE.match(value) or value[0] in "[{(}])>,;":
        return False
    return not (_IDENTIFIER.match(value) and _code_name(value))


_RUN = re.compile(r"(.)\1{5}")
_ALNUM = re.compile(r"[A-Za-z0-9]")


def _varied(value: str) -> bool:
    """Typed by a person or a generator, not a mask or a sequence: three letters or digits at
    least, no character six times in a row, no run like ``123456`` or ``abcdef``."""
    if len(_ALNUM.findall(value)) < 3 or len(set(value)) < min(6, len(value) // 3 + 1):
        return False
    if _RUN.search(value):
        return False
    return not sequential(value)


def sequential(value: str) -> bool:
    """Whether ``value`` holds six consecutive letters or digits in order, up or down
    (``123456``, ``abcdef``, ``654321``): typed by hand as a placeholder, not generated."""
    return _SEQUENCE.search(value) is not None


def _runs(alphabet: str) -> list[str]:
    return [alphabet[i : i + 6] for i in range(len(alphabet) - 5)]


_SEQUENCE = re.compile(
    "|".join(
        run
        for alphabet in ("0123456789", "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
        for run in (*_runs(alphabet), *_runs(alphabet[::-1]))
    )
)


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
        return (a, b) if literal(text[a:b], quoted=True) else None
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
                return span if literal(text[span[0] : span[1]], quoted=True) else None
        return None
    op = _OPERATOR.match(text, j)
    if op is None:
        if j > i and j < line_end and text[j] in _QUOTES:  # #define password "v", PASSWORD 'v'
            span = _quoted(text, j, line_end)
            if span and literal(text[span[0] : span[1]], quoted=True):
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
    if text[k] in _QUOTES:
        span = _quoted(text, k, line_end)
        if span is None:
            return None
        value = text[span[0] : span[1]]
        if op.group() == "," and _IDENTIFIER.match(value) and not any(c.isdigit() for c in value):
            return None  # get(['calendarAPIKey', 'emailAPIKey']): names listed, not assigned
        return span if literal(value, quoted=True) else None
    if text.startswith(('\\"', "\\'"), k):  # "{\"password\": \"v\"}" inside a string
        close = text.find(text[k : k + 2], k + 2, line_end)
        if close < 0:
            return None
        span = (k + 2, close)
        return span if literal(text[span[0] : span[1]], quoted=True) else None
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
            _EXPRESSION.search(value) or (_IDENTIFIER.match(value) and _code_name(value))
        ):
            return None
        return (a, b) if literal(value, quoted=False) or _shell_literal(value, in_call) else None
    a, b = _trim(text, line_start, name_start, a, b)
    rest = text[b:line_end].strip()
    if rest and not rest.startswith(_AFTER) and not _PAIR.match(rest):
        return None
    return (a, b) if literal(text[a:b], quoted=False) else None


_VALUE_ATTRIBUTE = re.compile(r"\s*value\s*=\s*")


def _attribute(text: str, i: int, line_end: int) -> tuple[int, int] | None:
    """The ``value="…"`` attribute that follows a ``key="NAME"`` or ``name="NAME"`` one."""
    m = _VALUE_ATTRIBUTE.match(text, i)
    if m is None or m.end() >= line_end or text[m.end()] not in _QUOTES:
        return None
    span = _quoted(text, m.end(), line_end)
    if span is None or not literal(text[span[0] : span[1]], quoted=True):
        return None
    return span


def _shell_literal(value: str, in_call: bool) -> bool:
    """An unquoted shell or env value is a literal even when it looks like code would:
    ``DB_PASSWORD=my.secret.pass``, ``ADMIN_PASSWORD=Sup3r(Secret)``."""
    if in_call or len(value) < 6 or not _varied(value) or _WORD_ONLY.match(value):
        return False
    if _PLACEHOLDER.search(value) or _PATH.search(value) or _URL_OR_MAIL.search(value):
        return False
    return not (_IDENTIFIER.match(value) and _code_name(value))


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
    return (a, b) if literal(text[a:b], quoted=text[j] in _QUOTES) else None


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
    return (offset + m.start(2), offset + m.end(2)) if literal(m.group(2), quoted=True) else None
