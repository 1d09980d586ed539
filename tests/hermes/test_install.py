"""``sgme hermes install``: the provider copied into a temporary Hermes home, with this
package's own convention and spool modules beside it (one implementation, not a copy to keep in
step), is found and loaded by Hermes' own plugin loader (hermes-agent 0.19.0 in .venv-hermes);
``$HERMES_HOME`` is the default home; a second install replaces the first whole, but files that
are not the provider's are not deleted without asking; and a built package carries its own
copy of the provider, so the command works without a checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import hermes_env
import pytest
from conftest import Run

from pipeline import cli, redactor
from pipeline.capture import spool
from pipeline.importers import chat, convention

ROOT = hermes_env.ROOT
SOURCE = hermes_env.PLUGIN
PROVIDER_FILES = sorted(p.name for p in SOURCE.iterdir() if p.suffix in (".py", ".yaml"))
SHARED = {
    "convention.py": Path(convention.__file__),
    "chat.py": Path(chat.__file__),
    "spool.py": Path(spool.__file__),
    "redactor.py": Path(redactor.__file__),
    "assignment.py": Path(redactor.__file__).with_name("assignment.py"),
    "literal.py": Path(redactor.__file__).with_name("literal.py"),
    "secret_formats.toml": Path(redactor.__file__).with_name(redactor.FORMATS_FILE),
}


def install(
    capsysbinary: pytest.CaptureFixture[bytes], monkeypatch: pytest.MonkeyPatch, *args: str
) -> Run:
    """``sgme hermes install ARGS`` in this process, with no SGME_* settings."""
    for name in list(os.environ):
        if name.startswith("SGME_"):
            monkeypatch.delenv(name)
    capsysbinary.readouterr()
    code = cli.main(["hermes", "install", *args])
    out, err = capsysbinary.readouterr()
    return Run(code, out, err.decode("utf-8"))


def python(args: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run this interpreter to completion; its stdout (fails with its stderr otherwise)."""
    done = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def installed(home: Path) -> dict[str, bytes]:
    plugin = home / "plugins" / "sgme"
    return {p.name: p.read_bytes() for p in sorted(plugin.iterdir())}


def sources() -> dict[str, bytes]:
    """The provider's files, and this package's modules byte for byte."""
    found = {name: (SOURCE / name).read_bytes() for name in PROVIDER_FILES}
    found.update({name: path.read_bytes() for name, path in SHARED.items()})
    return dict(sorted(found.items()))


def test_install_into_a_temporary_home_and_hermes_loads_it(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    hermes_env.python()
    home = tmp_path / "hermes-home"
    run = install(capsysbinary, monkeypatch, "--hermes-home", str(home))
    assert run.code == 0, run.err
    assert installed(home) == sources()
    assert not set(SHARED) & set(PROVIDER_FILES)  # no second copy in the provider's source
    text = run.out.decode("utf-8")
    assert f"Installed the SGME memory provider in {home / 'plugins' / 'sgme'}" in text
    for needle in (
        f"HERMES_HOME={home} hermes config set memory.provider sgme",
        "provider: sgme",
        "SGME_URL=http://127.0.0.1:8765",
        "SGME_AGENT_ID=hermes",
        "SGME_TOKEN=",
        "sgme token create --agent-id hermes --scope append,read",
        str(home / ".env"),
    ):
        assert needle in text, needle

    (home / "config.yaml").write_text("memory:\n  provider: sgme\n", encoding="utf-8")
    driver = hermes_env.Driver(home, hermes_env.hermes_env(home), tmp_path / "driver.log")
    try:
        loaded = driver("load")
    finally:
        driver.close()
    assert ["sgme", True] in loaded["discovered"]
    assert loaded["active"] == "sgme"
    assert (loaded["name"], loaded["class"]) == ("sgme", "SgmeMemoryProvider")
    assert loaded["module"] == "_hermes_user_memory.sgme"
    assert loaded["available"] is True


def test_hermes_home_is_the_default_and_a_reinstall_replaces_the_old_one_whole(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "from-env"
    plugin = home / "plugins" / "sgme"
    (plugin / "__pycache__").mkdir(parents=True)
    (plugin / "__init__.py").write_text("# an old provider: MemoryProvider\n")
    (plugin / "messages.py").write_text("# an old provider's module\n")
    monkeypatch.setenv("HERMES_HOME", str(home))
    run = install(capsysbinary, monkeypatch)
    assert run.code == 0, run.err
    assert installed(home) == sources()  # the new __init__.py and messages.py, no __pycache__
    assert sorted(p.name for p in (home / "plugins").iterdir()) == ["sgme"]  # nothing half-made
    assert "HERMES_HOME=" not in run.out.decode()  # hermes finds this home by itself


def test_files_that_are_not_the_providers_are_not_deleted_without_asking(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    plugin = home / "plugins" / "sgme"
    plugin.mkdir(parents=True)
    (plugin / "__init__.py").write_text("# someone's own plugin named sgme: MemoryProvider\n")
    (plugin / "notes.md").write_text("mine\n")
    run = install(capsysbinary, monkeypatch, "--hermes-home", str(home))
    assert run.code == 2
    assert "'notes.md'" in run.err and "--force" in run.err
    assert sorted(p.name for p in plugin.iterdir()) == ["__init__.py", "notes.md"]  # untouched
    forced = install(capsysbinary, monkeypatch, "--hermes-home", str(home), "--force")
    assert forced.code == 0, forced.err
    assert installed(home) == sources()


def test_help_leaves_out_the_data_options(
    capsysbinary: pytest.CaptureFixture[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SystemExit):
        cli.main(["hermes", "--help"])
    text = capsysbinary.readouterr().out.decode()
    assert "--hermes-home" in text and "--force" in text
    assert "--data-dir" not in text and "--database-url" not in text


def test_a_built_package_carries_the_provider(tmp_path: Path) -> None:
    """setup.py's build step, as a wheel build runs it, copies the provider into the package;
    ``sgme hermes install`` run from that build (no checkout beside it) installs it."""
    build = tmp_path / "build"
    python(["setup.py", "-q", "build_py", "--build-lib", str(build)], cwd=ROOT)
    packaged = build / "pipeline" / "hermes-provider"
    assert sorted(p.name for p in packaged.iterdir()) == PROVIDER_FILES
    assert not (build / "integrations").exists()

    home = tmp_path / "home"
    script = (
        "import sys, pipeline; from pipeline import cli; "
        "print('from', pipeline.__file__); "
        f"sys.exit(cli.main(['hermes', 'install', '--hermes-home', {str(home)!r}]))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGME_", "HERMES_"))}
    out = python(["-c", script], cwd=tmp_path, env={**env, "PYTHONPATH": str(build)})
    assert f"from {build / 'pipeline' / '__init__.py'}" in out  # the build, not the tree
    assert installed(home) == sources()
