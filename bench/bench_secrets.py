"""Secret redaction: recall on planted secrets, false positives on clean code-heavy messages,
and speed — ``pipeline.redactor`` against maintained detection libraries in the same run.

The corpus is generated (seeded) here:

* **planted**: agent sessions (a user asking, an assistant answering with code, tool results:
  shell, logs, config files) into which secrets of every kind the redactor knows are written
  the way they show up in transcripts (``tests/secret_samples.py``: an env line, a curl
  header, a JSON service-account file, a connection string, …) — at least ``--per-kind`` of
  each kind.
* **clean**: code-heavy messages with no secret: real source code (chunks of the Python
  standard library's own files, as an assistant or a ``read_file`` tool shows them), and
  generated tool output full of things that look random and must be kept — git logs and
  diffs (commit ids), pip and npm logs (sha256/sha512 hashes), docker digests, UUIDs, base64
  blobs, certificates and public keys, ``.env.example`` files with placeholders, Kubernetes
  manifests that reference secrets, prose about passwords and tokens.

Measured per detector: **recall** (a planted secret counts as found when the detector's
finding covers it: for ours, when no piece of it is left in the redacted text; for a library,
when one of its findings overlaps it), **false positives** (clean messages it would change,
per 10,000), and **throughput** (MB/s over the whole corpus). The baseline is detect-secrets
(Yelp, the most used Python scanner; default plugins and filters), run line by line as it
scans files; the Microsoft secret masker (its high-, medium-confidence and precisely
classified patterns) is the other library. A library that is not installed is left out
(both are in the ``dev`` extra that ``make install`` installs).

    .venv/bin/python bench/bench_secrets.py [--per-kind 100] [--clean 20000] [--seed 20]
"""

from __future__ import annotations

import argparse
import base64
import collections
import dataclasses
import hashlib
import json
import random
import sys
import sysconfig
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import secret_samples  # noqa: E402

from pipeline import redactor  # noqa: E402

Span = tuple[int, int]


@dataclasses.dataclass(frozen=True)
class Planted:
    """A message holding one secret of ``kind`` at ``span``."""

    kind: str
    text: str
    span: Span


# ---------------------------------------------------------------------------------------------
# the corpus

_WORDS = (
    "deploy",
    "build",
    "test",
    "cache",
    "retry",
    "queue",
    "worker",
    "index",
    "migrate",
    "schema",
    "config",
    "service",
    "request",
    "handler",
    "timeout",
    "session",
    "token",
    "user",
    "account",
    "key",
    "rotate",
    "vault",
    "secret",
    "password",
    "login",
)


def _prose(rng: random.Random) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(6, 24))).capitalize() + "."


def _shell_log(rng: random.Random) -> str:
    lines = [f"$ {rng.choice(['make test', 'npm run build', 'pytest -q', 'docker compose up'])}"]
    for _ in range(rng.randint(3, 12)):
        lines.append(
            f"[{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}] "
            f"{rng.choice(['INFO', 'WARN', 'DEBUG'])} {_prose(rng)}"
        )
    return "\n".join(lines)


def _sha(rng: random.Random, n: int = 32) -> str:
    return hashlib.sha256(rng.randbytes(16)).hexdigest()[: n * 2]


def _clean_generated(rng: random.Random) -> str:
    """Tool output and prose with ids, hashes and blobs, and no secret."""
    commit = hashlib.sha1(rng.randbytes(8)).hexdigest()
    choice = rng.randrange(14)
    if choice == 0:
        return "\n".join(
            f"commit {hashlib.sha1(rng.randbytes(8)).hexdigest()}\nAuthor: Dev <dev@example.com>"
            f"\nDate:   Mon Aug 3 11:18:06 2026 +0200\n\n    {_prose(rng)}\n"
            for _ in range(rng.randint(2, 6))
        )
    if choice == 1:
        return (
            f"diff --git a/app.py b/app.py\nindex {commit[:7]}..{_sha(rng, 4)[:7]} 100644\n"
            "--- a/app.py\n+++ b/app.py\n@@ -10,7 +10,8 @@ def connect(settings):\n"
            "-    password = settings.password\n+    password = os.environ['DB_PASSWORD']\n"
            "+    token = get_token(user)\n     return db.connect(user, password=password)\n"
        )
    if choice == 2:
        return "\n".join(
            f"{rng.choice(['requests', 'urllib3', 'idna', 'certifi'])}==2.{rng.randint(0, 31)}.0 "
            f"\\\n    --hash=sha256:{_sha(rng)}"
            for _ in range(rng.randint(2, 8))
        )
    if choice == 3:
        blob = base64.b64encode(rng.randbytes(64)).decode()
        return json.dumps(
            {
                "node_modules/left-pad": {
                    "version": "1.3.0",
                    "integrity": f"sha512-{blob}",
                    "resolved": "https://registry.npmjs.org/left-pad",
                }
            },
            indent=2,
        )
    if choice == 4:
        return (
            f"Step 4/9 : RUN pip install -r requirements.txt\n ---> {_sha(rng, 6)}\n"
            f"Successfully built {_sha(rng, 6)}\nwriting image sha256:{_sha(rng)}\n"
            f"pushed ghcr.io/acme/api@sha256:{_sha(rng)}"
        )
    if choice == 5:
        return json.dumps(
            {
                "id": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                "request_id": _sha(rng, 8),
                "etag": _sha(rng, 16),
                "thumbnail": base64.b64encode(rng.randbytes(rng.randint(60, 400))).decode(),
                "items": [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(3)],
            },
            indent=2,
        )
    if choice == 6:
        body = base64.b64encode(rng.randbytes(600)).decode()
        lines = [body[i : i + 64] for i in range(0, len(body), 64)]
        return "-----BEGIN CERTIFICATE-----\n" + "\n".join(lines) + "\n-----END CERTIFICATE-----"
    if choice == 7:
        key = base64.b64encode(b"\x00\x00\x00\x07ssh-rsa" + rng.randbytes(270)).decode()
        return f"ssh-rsa {key} dev@laptop"
    if choice == 8:
        return (
            "# .env.example — copy to .env and fill in\nDATABASE_URL=postgres://user:${DB_PASSWORD}"
            "@localhost:5432/app\nOPENAI_API_KEY=your-api-key-here\nSECRET_KEY=<generate one>\n"
            "REDIS_URL=redis://localhost:6379/0\nDEBUG=true\n"
        )
    if choice == 9:
        return (
            "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: api\n    env:\n"
            "    - name: DB_PASSWORD\n      valueFrom:\n        secretKeyRef:\n"
            "          name: db-credentials\n          key: password\n"
            "    - name: API_TOKEN\n      valueFrom:\n        secretKeyRef: {name: api, key: token}"
        )
    if choice == 10:
        return (
            f"You can rotate the API key from the dashboard; the old token stops working after "
            f"{rng.randint(1, 24)} hours. Never paste a password into the chat. {_prose(rng)}"
        )
    if choice == 11:
        return _shell_log(rng) + f"\nbuild {commit} ok in {rng.random():.2f}s"
    if choice == 12:
        return (
            f"```python\ndef login(user: str, password: str) -> Session:\n"
            f"    token = auth.issue(user, password)\n    api_key = os.environ['API_KEY']\n"
            f"    headers = {{'Authorization': f'Bearer {{token}}'}}\n"
            f"    return Session(headers=headers, max_tokens={rng.randint(1, 4096)})\n```"
        )
    return f"Trace id {uuid.UUID(int=rng.getrandbits(128))} at {_sha(rng, 8)}: {_prose(rng)}"


def _stdlib_chunks(limit: int) -> list[str]:
    """Real source code: the Python standard library's files, cut in chunks of about 2 KB."""
    folder = Path(sysconfig.get_paths()["stdlib"])
    chunks = []
    for path in sorted(folder.glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        lines = text.split("\n")
        for start in range(0, len(lines), 60):
            chunk = "\n".join(lines[start : start + 60])
            if chunk.strip():
                chunks.append(
                    f"`{path.name}` lines {start + 1}-{start + 60}:\n```python\n{chunk}\n```"
                )
            if len(chunks) >= limit:
                return chunks
    return chunks


def clean_corpus(rng: random.Random, count: int) -> list[str]:
    """``count`` messages with no secret: half real code, half generated tool output."""
    code = _stdlib_chunks(count // 2)
    generated = [_clean_generated(rng) for _ in range(count - len(code))]
    messages = code + generated
    rng.shuffle(messages)
    return messages


def planted_corpus(rng: random.Random, per_kind: int) -> tuple[list[Planted], list[str]]:
    """Sessions with secrets written into them: the planted messages (with where the secret
    is), and the session's other messages (clean, counted with the clean corpus)."""
    planted: list[Planted] = []
    around: list[str] = []
    kinds = sorted(secret_samples.MAKERS) * per_kind
    rng.shuffle(kinds)
    for kind in kinds:
        text, secret = secret_samples.message(kind, rng)
        if secret not in text:  # written inside a JSON string
            secret = json.dumps(secret)[1:-1]
        if rng.random() < 0.5:  # inside a longer tool output
            text = _shell_log(rng) + "\n" + text + "\n" + _shell_log(rng)
        start = text.index(secret)
        planted.append(Planted(kind, text, (start, start + len(secret))))
        around.append(_prose(rng) if rng.random() < 0.5 else _clean_generated(rng))
    return planted, around


# ---------------------------------------------------------------------------------------------
# detectors: text → the spans they would redact

Detector = Callable[[str], list[Span]]


def ours(text: str) -> list[Span]:
    return [(f.start, f.end) for f in redactor.scan(text)]


def _detect_secrets() -> Detector | None:
    try:
        from detect_secrets.core import scan
        from detect_secrets.settings import default_settings
    except ImportError:
        return None

    def detect(text: str) -> list[Span]:
        """As ``detect-secrets scan`` reads a file: line by line, every default plugin and
        filter (the transcript as a Markdown file)."""
        lines = text.split("\n")
        starts = [0]
        for line in lines:
            starts.append(starts[-1] + len(line) + 1)
        spans = []
        with default_settings():
            numbered = list(enumerate(lines, start=1))
            for found in scan._process_line_based_plugins(numbered, filename="transcript.md"):
                value = found.secret_value or ""
                line = lines[found.line_number - 1]
                at = line.find(value) if value else -1
                if at >= 0:
                    offset = starts[found.line_number - 1]
                    spans.append((offset + at, offset + at + len(value)))
        return spans

    return detect


def _ms_masker() -> Detector | None:
    try:
        import microsoft_security_utilities_secret_masker as ms
    except ImportError:
        return None
    folder = Path(ms.__file__).parent / "GeneratedRegexPatterns"
    patterns: set[object] = set()
    for name in (
        "HighConfidenceSecurityModels.json",
        "MediumConfidenceSecurityModels.json",
        "PreciselyClassifiedSecurityKeys.json",
    ):
        patterns |= set(ms.load_regex_patterns_from_json_file(str(folder / name)))
    masker = ms.SecretMasker(patterns)

    def detect(text: str) -> list[Span]:
        return [(d.start, d.end) for d in masker.detect_secrets(text)]

    return detect


def _found(planted: Planted, spans: Iterable[Span], *, whole: bool) -> bool:
    lo, hi = planted.span
    if whole:  # ours: the whole secret must be inside what is replaced
        return any(a <= lo and hi <= b for a, b in spans) or _covered(planted.span, spans)
    return any(a < hi and lo < b for a, b in spans)


def _covered(span: Span, spans: Iterable[Span]) -> bool:
    """Whether ``spans`` together cover ``span`` (a secret found in pieces)."""
    lo, hi = span
    for a, b in sorted(spans):
        if a <= lo < b:
            lo = b
    return lo >= hi


@dataclasses.dataclass
class Result:
    name: str
    found: int = 0
    planted: int = 0
    changed: int = 0  #: clean messages with a finding
    clean: int = 0
    seconds: float = 0.0
    size: int = 0
    by_kind: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    missed: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    examples: list[str] = dataclasses.field(default_factory=list)

    @property
    def recall(self) -> float:
        return self.found / self.planted

    @property
    def per_10k(self) -> float:
        return 10_000 * self.changed / self.clean

    @property
    def mb_s(self) -> float:
        return self.size / self.seconds / 1e6


def run(name: str, detect: Detector, planted: list[Planted], clean: list[str]) -> Result:
    result = Result(name, planted=len(planted), clean=len(clean))
    started = time.perf_counter()
    spans_planted = [detect(p.text) for p in planted]
    spans_clean = [detect(text) for text in clean]
    result.seconds = time.perf_counter() - started
    result.size = sum(len(p.text.encode()) for p in planted) + sum(len(t.encode()) for t in clean)
    for p, spans in zip(planted, spans_planted, strict=True):
        result.by_kind[p.kind] += 1
        if _found(p, spans, whole=name == "pipeline.redactor"):
            result.found += 1
        else:
            result.missed[p.kind] += 1
    for text, spans in zip(clean, spans_clean, strict=True):
        if spans:
            result.changed += 1
            if len(result.examples) < 5:
                a, b = spans[0]
                result.examples.append(repr(text[max(0, a - 40) : b + 20]))
    return result


def _table(results: list[Result]) -> None:
    base = results[0] if results and "baseline" in results[0].name else None
    head = "| detector | recall on planted | clean messages changed | per 10,000 | MB/s |"
    if base:
        head += " recall / baseline | false positives / baseline | speed / baseline |"
    print(head)
    print("|---|---|---|---|---|" + ("---|---|---|" if base else ""))
    for r in results:
        row = (
            f"| {r.name} | {r.recall:.2%} ({r.found}/{r.planted}) | {r.changed}/{r.clean} | "
            f"{r.per_10k:.1f} | {r.mb_s:.2f} |"
        )
        if base:
            fp = f"{r.changed / base.changed:.3f}x" if base.changed else "n/a"
            row += f" {r.recall / base.recall:.2f}x | {fp} | {r.mb_s / base.mb_s:.1f}x |"
        print(row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-kind", type=int, default=100, help="planted secrets per kind")
    parser.add_argument("--clean", type=int, default=20_000, help="clean messages")
    parser.add_argument(
        "--sample",
        type=int,
        default=2_000,
        help="clean messages the libraries are compared on (detect-secrets reads ~0.1 MB/s)",
    )
    parser.add_argument("--seed", type=int, default=20)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    planted, around = planted_corpus(rng, args.per_kind)
    clean = clean_corpus(rng, args.clean) + around
    size = sum(len(p.text.encode()) for p in planted) + sum(len(t.encode()) for t in clean)
    print(
        f"corpus: {len(planted)} planted secrets ({len(secret_samples.MAKERS)} kinds x "
        f"{args.per_kind}), {len(clean)} clean messages ({args.clean} code-heavy, "
        f"{len(around)} around the planted ones), {size / 1e6:.1f} MB, seed {args.seed}"
    )
    sample = random.Random(args.seed + 1).sample(clean, min(args.sample, len(clean)))
    planted_sample = random.Random(args.seed + 2).sample(planted, min(args.sample, len(planted)))
    detectors: list[tuple[str, Detector | None]] = [
        ("detect-secrets 1.5 (baseline)", _detect_secrets()),
        ("microsoft secret masker 1.0.0b4", _ms_masker()),
        ("pipeline.redactor", ours),
    ]
    compared = []
    for name, detect in detectors:
        if detect is None:
            print(f"{name}: not installed (make install installs it), left out")
            continue
        compared.append(run(name, detect, planted_sample, sample))
    print(
        f"\nside by side, on {len(planted_sample)} planted and {len(sample)} clean messages "
        "drawn from the corpus:\n"
    )
    _table(compared)
    mine = run("pipeline.redactor", ours, planted, clean)
    print("\npipeline.redactor on the whole corpus:\n")
    _table([mine])
    print(
        "\nby kind (found/planted): "
        + ", ".join(
            f"{k} {mine.by_kind[k] - mine.missed[k]}/{mine.by_kind[k]}"
            for k in sorted(mine.by_kind)
        )
    )
    for r in [*compared, mine]:
        if r.examples:
            print(f"\n{r.name}: the first clean messages it would change:")
            for example in r.examples:
                print("   ", example[:160])


if __name__ == "__main__":
    main()
