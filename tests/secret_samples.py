"""Real-looking secrets of the main kinds :mod:`pipeline.redactor` knows, made from a seeded
random generator (never real credentials), in their usual surroundings; the look-alikes that
must survive untouched (code, hashes, UUIDs, base64 blobs, commit ids); and a value of any
vendor format's form made from its pattern (:func:`from_pattern`). Used by the unit tests and
the no-byte-on-disk tests (``bench/bench_secrets.py`` measures on public data instead)."""

from __future__ import annotations

import base64
import hashlib
import importlib
import json
import random
import re
import string
import uuid
from collections.abc import Callable
from typing import Any

ALNUM = string.ascii_letters + string.digits
UPPER = string.ascii_uppercase + string.digits
HEX = "0123456789abcdef"
URLSAFE = ALNUM + "-_"


def _s(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _jwt(rng: random.Random) -> str:
    header = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    claims = {"sub": str(rng.randrange(10**9)), "name": "Ada", "iat": 1785755886}
    return f"{header}.{_b64url(json.dumps(claims).encode())}.{_b64url(rng.randbytes(32))}"


def _pem(rng: random.Random, kind: str = "RSA PRIVATE KEY") -> str:
    body = base64.b64encode(rng.randbytes(rng.randint(300, 900))).decode()
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    return f"-----BEGIN {kind}-----\n" + "\n".join(lines) + f"\n-----END {kind}-----"


def _password(rng: random.Random) -> str:
    return _s(rng, ALNUM, rng.randint(6, 10)) + rng.choice("!#%+") + _s(rng, ALNUM, 3)


#: kind → how a value of it is made; kind → how it is written into a message (the secret in
#: its usual surroundings)
MAKERS: dict[str, Callable[[random.Random], str]] = {
    "private-key": lambda r: _pem(
        r, r.choice(["RSA PRIVATE KEY", "PRIVATE KEY", "EC PRIVATE KEY", "OPENSSH PRIVATE KEY"])
    ),
    "aws-access-key": lambda r: r.choice(["AKIA", "ASIA"]) + _s(r, UPPER, 16),
    "github-token": lambda r: r.choice(["ghp_", "gho_", "ghs_"]) + _s(r, ALNUM, 36),
    "gitlab-token": lambda r: "glpat-" + _s(r, URLSAFE, 20),
    "slack-webhook": lambda r: (
        "https://hooks.slack.com/services/T"
        + _s(r, UPPER, 8)
        + "/B"
        + _s(r, UPPER, 8)
        + "/"
        + _s(r, ALNUM, 24)
    ),
    "slack-token": lambda r: (
        r.choice(["xoxb-", "xoxp-"]) + f"{r.randrange(10**11)}-"
        f"{r.randrange(10**11)}-" + _s(r, ALNUM, 24)
    ),
    "anthropic-key": lambda r: "sk-ant-api03-" + _s(r, URLSAFE, 93) + "AA",
    "openai-key": lambda r: r.choice(["sk-proj-" + _s(r, URLSAFE, 120), "sk-" + _s(r, ALNUM, 48)]),
    "stripe-key": lambda r: r.choice(["sk_live_", "rk_live_", "sk_test_"]) + _s(r, ALNUM, 24),
    "google-api-key": lambda r: "AIza" + _s(r, URLSAFE, 35),
    "google-oauth-token": lambda r: "ya29." + _s(r, URLSAFE, 120),
    "huggingface-token": lambda r: "hf_" + _s(r, ALNUM, 34),
    "npm-token": lambda r: "npm_" + _s(r, ALNUM, 36),
    "pypi-token": lambda r: "pypi-AgEIcHlwaS5vcmc" + _s(r, URLSAFE, 70),
    "sendgrid-key": lambda r: "SG." + _s(r, URLSAFE, 22) + "." + _s(r, URLSAFE, 43),
    "twilio-key": lambda r: "SK" + _s(r, HEX, 32),
    "mailgun-key": lambda r: "key-" + _s(r, HEX, 32),
    "telegram-bot-token": lambda r: f"{r.randrange(10**8, 10**10)}:AA" + _s(r, URLSAFE, 33),
    "shopify-token": lambda r: "shpat_" + _s(r, HEX, 32),
    "digitalocean-token": lambda r: "dop_v1_" + _s(r, HEX, 64),
    "sgme-token": lambda r: "sgme_" + _s(r, URLSAFE, 43),
    "azure-storage-key": lambda r: base64.b64encode(r.randbytes(64)).decode(),
    "jwt": _jwt,
    "url-password": _password,
    "bearer-token": lambda r: _s(r, ALNUM, 40),
    "basic-auth": lambda r: base64.b64encode(f"admin:{_password(r)}".encode()).decode(),
    "password": _password,
    "aws-secret-key": lambda r: _s(r, ALNUM + "/+", 40),
    "api-key": lambda r: _s(r, ALNUM, 32),
    "token": lambda r: _s(r, URLSAFE, 40),
    "secret": lambda r: _s(r, ALNUM, 28),
}

CONTEXTS: dict[str, list[str]] = {
    "private-key": [
        "Here is the key file:\n\n```\n{v}\n```",
        '{{"type": "service_account", "private_key": {j}, "client_email": "a@b.iam"}}',
        "$ cat ~/.ssh/id_rsa\n{v}\n$ ",
    ],
    "url-password": [
        "DATABASE_URL=postgres://app:{v}@db.internal:5432/app",
        "redis = Redis.from_url('redis://default:{v}@cache.example.com:6379/0')",
        "git clone https://deploy:{v}@git.example.com/team/repo.git",
        "mongodb+srv://admin:{v}@cluster0.ab1cd.mongodb.net/prod?retryWrites=true",
    ],
    "bearer-token": [
        'curl -H "Authorization: Bearer {v}" https://api.example.com/v1/items',
        "Authorization: Bearer {v}",
        'headers = {{"Authorization": "Bearer {v}"}}',
    ],
    "basic-auth": ["Authorization: Basic {v}", 'curl -H "Authorization: Basic {v}" http://x'],
    "password": [
        "DB_PASSWORD={v}",
        "password: {v}",
        '"password": "{v}",',
        "mysql -u root --password={v} shop",
        'conn = psycopg.connect(host="db", password="{v}")',
        "export PGPASSWORD='{v}'",
    ],
    "aws-secret-key": [
        "aws_secret_access_key = {v}",
        "AWS_SECRET_ACCESS_KEY={v}",
        '"SecretAccessKey": "{v}",',
    ],
    "api-key": ['API_KEY="{v}"', "x-api-key: {v}", '"apiKey": "{v}"', "--api-key {v}"],
    "token": ["ACCESS_TOKEN={v}", '"refresh_token": "{v}"', "auth_token = '{v}'"],
    "secret": ["CLIENT_SECRET={v}", 'client_secret: "{v}"', "JWT_SECRET={v}"],
    "azure-storage-key": [
        "DefaultEndpointsProtocol=https;AccountName=prodstore;AccountKey={v};"
        "EndpointSuffix=core.windows.net",
    ],
}
#: how a secret of any other kind is written: as it would show in a transcript
GENERIC = [
    "export TOKEN={v}",
    "I set the key to {v} in the dashboard, is that right?",
    "```bash\ncurl -u user {v} https://x\n```",
    "config: {{ key: '{v}' }}",
    "The tool printed:\n{v}\n",
    "use `{v}`",
]


def message(kind: str, rng: random.Random) -> tuple[str, str]:
    """``(text, secret)``: a message holding one secret of ``kind`` in one of its usual
    surroundings."""
    value = MAKERS[kind](rng)
    template = rng.choice(CONTEXTS.get(kind, GENERIC))
    return template.format(v=value, j=json.dumps(value)), value


def look_alikes(rng: random.Random) -> list[str]:
    """Things that look random and must be kept: ids, hashes, blobs, code."""
    digest = hashlib.sha256(rng.randbytes(16)).hexdigest()
    commit = hashlib.sha1(rng.randbytes(16)).hexdigest()
    blob = base64.b64encode(rng.randbytes(48)).decode()
    return [
        f"commit {commit}\nAuthor: Ada <ada@example.com>",
        f"sha256:{digest}  dist/app.tar.gz",
        f"request id {uuid.UUID(int=rng.getrandbits(128), version=4)}",
        f"data:image/png;base64,{blob}",
        f'"integrity": "sha512-{base64.b64encode(rng.randbytes(64)).decode()}"',
        f"docker pull ghcr.io/acme/app@sha256:{digest}",
        f"git checkout {commit[:12]}",
        "token = tokens[i]\npassword = getpass.getpass()\napi_key = os.environ['API_KEY']",
        'headers = {"Authorization": f"Bearer {token}"}',
        "max_tokens=1024, temperature=0.2",
        "DB_PASSWORD=${DB_PASSWORD}",
        "postgresql://postgres@127.0.0.1:5432/postgres",
        "git@github.com:acme/app.git",
        f'etag: W/"{digest[:32]}"',
    ]


# ---------------------------------------------------------------------------------------------
# a value of a format's form, made from its pattern

_PRINTABLE = string.ascii_letters + string.digits + "_-"


def from_pattern(pattern: str, rng: random.Random) -> str:
    """A string ``pattern`` matches (assertions left out), made from a seeded generator:
    a value of a vendor format's form, never a real one."""
    # the regular expression parser's own modules (private, and without type stubs)
    c: Any = importlib.import_module("re._constants")
    parser: Any = importlib.import_module("re._parser")
    categories = {
        c.CATEGORY_DIGIT: string.digits,
        c.CATEGORY_WORD: string.ascii_letters + string.digits + "_",
        c.CATEGORY_SPACE: " ",
    }

    def chars(items: list[tuple[Any, Any]]) -> str:
        allowed: set[str] = set()
        negate = False
        for op, av in items:
            if op is c.NEGATE:
                negate = True
            elif op is c.LITERAL:
                allowed.add(chr(av))
            elif op is c.RANGE:
                allowed.update(chr(x) for x in range(av[0], av[1] + 1))
            elif op is c.CATEGORY:
                allowed.update(categories.get(av, ""))
        if negate:
            return "".join(sorted(set(_PRINTABLE) - allowed))
        return "".join(sorted(a for a in allowed if a.isprintable()))

    def walk(items: list[tuple[Any, Any]], icase: bool = False) -> str:
        out = []
        for op, av in items:
            if op is c.LITERAL:
                out.append(chr(av))
            elif op is c.NOT_LITERAL:
                out.append(rng.choice([x for x in _PRINTABLE if x != chr(av)]))
            elif op is c.ANY:
                out.append(".")  # an unescaped dot stands for one in a domain (hooks.slack.com)
            elif op is c.IN:
                choice = rng.choice(chars(av))
                out.append(choice.upper() if icase and rng.random() < 0.5 else choice)
            elif op in (c.MAX_REPEAT, c.MIN_REPEAT):
                lo, hi, sub = av
                hi = min(lo + 12 if hi is c.MAXREPEAT else hi, max(lo, 300))
                out.extend(walk(list(sub), icase) for _ in range(rng.randint(lo, hi)))
            elif op is c.SUBPATTERN:
                _, add, remove, sub = av
                inner = (icase or bool(add & re.IGNORECASE)) and not remove & re.IGNORECASE
                out.append(walk(list(sub), inner))
            elif op is c.BRANCH:
                out.append(walk(list(rng.choice(av[1])), icase))
            elif op is c.CATEGORY:
                out.append(rng.choice(categories.get(av, "x")))
        return "".join(out)

    parsed = parser.parse(pattern)
    return walk(list(parsed), bool(parsed.state.flags & re.IGNORECASE))
