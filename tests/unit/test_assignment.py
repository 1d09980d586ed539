"""Reading a value assigned to a secret's name (pipeline.assignment): which names say they
hold a secret, which values are literals, and the value's exact span in each syntax."""

from __future__ import annotations

import pytest

from pipeline import assignment, literal, redactor


@pytest.mark.parametrize(
    "name, kind",
    [
        ("DB_PASSWORD", "password"),
        ("PGPASSWORD", "password"),
        ("MYSQLPASS", "password"),
        ("db_pass", "password"),
        ("user_pw", "password"),
        ("SECRET\\_KEY", "api-key"),
        ("clientSecret", "secret"),
        ("x-api-key", "api-key"),
        ("apikey", "api-key"),
        ("aws_secret_access_key", "aws-secret-key"),
        ("SecretAccessKey", "aws-secret-key"),
        ("GITHUB_TOKEN", "token"),
        ("authtoken", "token"),
        ("password_confirmation", "password"),
        ("secret_key_base", "api-key"),
        ("oauth2-bearer", "token"),
        ("passin", "password"),
        ("token_type", None),
        ("max_tokens", None),
        ("tokens", None),
        ("password_hash", None),
        ("secret_name", None),
        ("key", None),
        ("primaryKey", None),
        ("csrf_token", None),
        ("authenticity_token", None),
        ("publicToken", None),
        ("bypass", None),
        ("compass", None),
    ],
)
def test_a_name_says_which_kind_of_secret_it_holds(name: str, kind: str | None) -> None:
    assert assignment.name_kind(name) == kind


@pytest.mark.parametrize(
    "value, quoted",
    [
        ("Tr0ub4dor&3", True),
        ("Zk4rT8wQ1s", False),
        ("m{{h}o)p${e]nob(ody[finds>-_$#thisone}}", True),
        ("value with quotes and spaces", True),
        ("N1DdkUD3E73", False),
        ("dipPr127Gg!", False),
    ],
)
def test_literals(value: str, quoted: bool) -> None:
    assert literal.secret(value, quoted=quoted)


@pytest.mark.parametrize(
    "value, quoted",
    [
        ("self.token", False),
        ("args.nvr_password", False),
        ("getpass()", False),
        ("os.environ['API_KEY']", False),
        ("current_token", False),
        ("PASSWORD", False),
        ("String!", False),
        ("Optional[str]", False),
        ("${DB_PASSWORD}", True),
        ("pass:$smtp_password", True),
        ("{{ .Values.password }}", True),
        ("/path/to/your/key.pem", True),
        ("secrets/service-account.json", True),
        ("https://example.com/token", True),
        ("ada@example.com", True),
        ("ENC(G6N718UuyPE5bHyWKyuLQSm02auQ)", True),
        ("<your-api-key>", True),
        ("your_password_here", True),
        ("changeme", True),
        ("hunter2", True),
        ("********", True),
        ("xxxxxxxxxxxx", True),
        ("include", True),
        ("random-secret", True),
        ("SECRET_KEY", True),
        ("my secret", True),
        ("Password: ", True),
        ("abc", True),
        ("aaaaaaaaaaa1", True),
        ("abcdef123456", True),
    ],
)
def test_what_is_not_a_literal(value: str, quoted: bool) -> None:
    assert not literal.secret(value, quoted=quoted)


@pytest.mark.parametrize(
    "text, value",
    [
        ("DB_PASSWORD=my.secret.pass # the db", "my.secret.pass"),
        ("https://x.example/cb?token=Zq8Wn3Vb6TyA&next=/home", "Zq8Wn3Vb6TyA"),
        ("connect(host, password='Zk4rT8wQ1s')", "Zk4rT8wQ1s"),
        ('System.setProperty("API_TOKEN", "t0k3nV4lu3Xq9");', "t0k3nV4lu3Xq9"),
        ('  "clientSecret" => "Xm1P4ssw0rd!",', "Xm1P4ssw0rd!"),
        ("$apiKey .= 'k3yV4lu3G0L4ng99';", "k3yV4lu3G0L4ng99"),
        ('<add key="ClearTextPassword" value="D3f1n3dPw!9" />', "D3f1n3dPw!9"),
        ("SELECT 1; ALTER ROLE app PASSWORD('Zk4rT8wQ1s');", "Zk4rT8wQ1s"),
        ('val password: String = "exord13Paw64", // scala', "exord13Paw64"),
        ("mysql -u root --password Sne3sd8AZjq", "Sne3sd8AZjq"),
        ("openssl pkcs12 -passin pass:nCzx8A8#! -in a.p12", "nCzx8A8#!"),
        ("-Password:dipPr133Gg!", "dipPr133Gg!"),
        ("SECRET KEY: AIhq5Xyb1Gga9Q3", "AIhq5Xyb1Gga9Q3"),
        ("password:dipPr145Gg! username:master", "dipPr145Gg!"),
    ],
)
def test_the_value_is_read_as_its_syntax_says(text: str, value: str) -> None:
    assert [text[a.start : a.end] for a in _assigned(text)] == [value]


def _assigned(text: str) -> list[assignment.Assigned]:
    """What :func:`assignment.read` finds at each word of a secret's name in ``text``, as
    the scan hands them over."""
    found = []
    lowered = text.lower()
    read_to = -1
    for at in range(len(text)):
        word = next((w for w in redactor.NAME_WORDS if lowered.startswith(w, at)), None)
        if word is None or at < read_to:
            continue
        assigned, read_to = assignment.read(text, at, at + len(word))
        if assigned is not None:
            found.append(assigned)
    return found


@pytest.mark.parametrize(
    "text",
    [
        "password = a + b",
        "password: keep it empty",
        "token = request.headers.get('Authorization')",
        "if not password:",
        "Replace `<token>` and `<hash>`.",
        "`PASSWORD`, `CONFLUENCE_SERVER`, and `SPACE`",
    ],
)
def test_code_and_prose_assign_no_literal(text: str) -> None:
    assert _assigned(text) == []
