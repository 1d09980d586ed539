"""Whether a value written after a secret's name is a secret: a literal — not code that
stands for one, nor a placeholder.

Pure: strings in, a yes or a no out; nothing of ours imported. :mod:`pipeline.assignment`
reads a value where its text's grammar puts it and asks :func:`secret`; :mod:`pipeline.redactor`
asks :func:`placeholder` and :func:`sequential` of the values its context rules and vendor
formats find. What is not a secret:

* code — expressions and references (``self.token``, ``args.password``, ``os.environ["X"]``,
  ``getpass()``, ``Key::new(…)``, ``$VAR``, ``${VAR}``, ``pass:$smtp_password``, ``\\(pw)``),
  names (``PASSWORD``, ``current_token``), types (``String!``, ``String?``,
  ``Optional[str]``);
* paths, URLs and e-mail addresses (``/path/to/key.pem``, ``secrets/sa.json``);
* encrypted values and references to a store (``ENC(…)``, ``!vault``, sealed secrets,
  ``vault:…``, ``arn:aws:…``);
* placeholders (``<your-key>``, ``***``, ``xxxx``, ``changeme``, ``your_password_here``,
  ``hunter2``, ``dbpassword``), typed runs (``123456``, ``abcdef``), masks, prompts
  (``'Password: '``), and single words (``credentials: 'include'``, ``'random-secret'``).
"""

from __future__ import annotations

import re

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
EXPRESSION = re.compile(
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
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def code_name(value: str) -> bool:
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


def secret(value: str, *, quoted: bool) -> bool:
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
        if IDENTIFIER.match(value) and code_name(value):  # 'SECRET_KEY', "authToken"
            return False
        # a passphrase has three words or more; two are prose ("my secret")
        return " " not in value or len(value.split()) >= 3
    if EXPRESSION.search(value) or _TYPE.match(value) or value[0] in "[{(}])>,;":
        return False
    return not (IDENTIFIER.match(value) and code_name(value))


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


def shell_secret(value: str, in_call: bool) -> bool:
    """An unquoted shell or env value is a literal even when it looks like code would:
    ``DB_PASSWORD=my.secret.pass``, ``ADMIN_PASSWORD=Sup3r(Secret)``."""
    if in_call or len(value) < 6 or not _varied(value) or _WORD_ONLY.match(value):
        return False
    if _PLACEHOLDER.search(value) or _PATH.search(value) or _URL_OR_MAIL.search(value):
        return False
    return not (IDENTIFIER.match(value) and code_name(value))
