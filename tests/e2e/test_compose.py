"""docker-compose.yml cannot run here (no Docker db), so it is kept correct by reading it and
by running each command it runs outside Docker."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from pipeline import cli
from pipeline.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _environment() -> dict[str, str]:
    return dict(COMPOSE["x-sgme"]["environment"])


def _commands() -> dict[str, list[str]]:
    return {name: svc["command"] for name, svc in COMPOSE["services"].items() if "command" in svc}


def test_services_and_redis_settings() -> None:
    services = COMPOSE["services"]
    assert {
        "postgres",
        "redis",
        "migrate",
        "api",
        "worker-append",
        "worker-refine",
        "beat",
        "flower",
    } <= set(services)
    redis = " ".join(services["redis"]["command"])
    assert "--appendonly yes" in redis and "--maxmemory-policy noeviction" in redis
    assert services["beat"]["deploy"]["replicas"] == 1
    assert services["api"]["ports"] == ["127.0.0.1:8765:8765"]
    assert services["migrate"]["restart"] == "no"


@pytest.mark.parametrize("service", sorted(k for k, v in _commands().items() if v[0] == "sgme"))
def test_sgme_commands_parse(service: str) -> None:
    argv = _commands()[service][1:]
    args = cli.build_parser().parse_args(argv)
    assert args.command == argv[0]
    queues = {"worker-append": "append", "worker-refine": "refine,archive"}
    if service in queues:
        assert args.queues == queues[service]


def test_production_config_loads_with_auth_on() -> None:
    settings = Settings.load(ROOT / "config" / "production.yaml", environ={})
    assert settings.host == "0.0.0.0"
    # the container binds every address, so auth must be on from the first start
    assert settings.require_auth is True
    # the published port (127.0.0.1, localhost) and other containers (`api`) are answered
    assert {"localhost", "127.0.0.1", "api"} <= set(settings.allowed_hosts)
    default = Settings.load(ROOT / "config" / "default.yaml", environ={})
    assert default == Settings()  # default.yaml documents exactly the built-in defaults
    assert default.require_auth is False and default.host == "127.0.0.1"


def test_redis_and_postgres_are_on_the_internal_network_only() -> None:
    """The sgme.append task path trusts the broker: nothing outside may reach Redis."""
    services, networks = COMPOSE["services"], COMPOSE["networks"]
    assert networks["internal"]["internal"] is True
    for name in ("redis", "postgres"):
        assert services[name]["networks"] == ["internal"], name
        assert "ports" not in services[name], name
    published = {name for name, svc in services.items() if svc.get("ports")}
    assert published == {"api", "flower"}
    for name in published:
        assert all(p.startswith("127.0.0.1:") for p in services[name]["ports"]), name
        assert "edge" in services[name]["networks"]


def test_the_first_admin_token_is_a_one_shot_step() -> None:
    token = COMPOSE["services"]["token"]
    assert token["profiles"] == ["tools"]  # `up` does not run it; `run --rm token` does
    assert token["restart"] == "no"
    args = cli.build_parser().parse_args(token["command"][1:])
    assert (args.command, args.token_command) == ("token", "create")
    assert args.agent_id == ["*"] and args.scope == ["admin"]
    assert "docker compose run --rm token" in (ROOT / "docker-compose.yml").read_text()
    assert token["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_flower_command_serves_with_basic_auth(tmp_path: Path) -> None:
    command = _commands()["flower"]
    assert command[:2] == ["celery", "flower"]
    assert _environment()["CELERY_BROKER_URL"] == _environment()["SGME_BROKER_URL"]
    port = _free_port()
    argv = [
        arg.replace("${FLOWER_USER}", "ops").replace("${FLOWER_PASSWORD}", "s3cret")
        for arg in command[1:]
    ]
    argv = [a for a in argv if not a.startswith("--port")] + [
        f"--port={port}",
        "--address=127.0.0.1",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGME_")}
    env.update(SGME_DATA_DIR=str(tmp_path), CELERY_BROKER_URL="memory://")
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", *argv],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                anonymous = httpx.get(f"http://127.0.0.1:{port}/", timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
                assert time.monotonic() < deadline, "flower did not start"
                time.sleep(0.2)
        assert anonymous.status_code == 401
        authorized = httpx.get(f"http://127.0.0.1:{port}/", auth=("ops", "s3cret"), timeout=5)
        assert authorized.status_code == 200
        assert "Flower" in authorized.text
    finally:
        proc.kill()
        proc.wait(10)
        if proc.stderr:
            proc.stderr.close()
