"""The cooldown of full re-refines (issue 9), on SQLite and PostgreSQL: ``POST
/v1/files/{id}/refine`` answers 429 with ``Retry-After`` while the file's last full re-refine
runs and for ``refine_cooldown_seconds`` after it finished; the state is in the index, so two
API processes agree; a failed or archived run does not hold the file forever; ``sgme refine
--full`` (the operator's own command) is not throttled."""

from __future__ import annotations

import datetime as dt
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helpers
import pytest
import sqlalchemy as sa
from conftest import set_row

from pipeline import auth, database, errors, refine, tables
from pipeline.api import app as api_app
from pipeline.service import Service
from pipeline.settings import Settings

with warnings.catch_warnings():
    from starlette.exceptions import StarletteDeprecationWarning

    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from fastapi.testclient import TestClient

COOLDOWN = 300


def service_for(db: database.Database, data_dir: Path, database_url: str, **extra: Any) -> Service:
    options: dict[str, Any] = {
        "allowed_hosts": ("testserver",),
        "token_cache_seconds": 0,
        "refine_cooldown_seconds": COOLDOWN,
        # due at once, so a full re-refine is claimed (and "running") as soon as it is asked for
        "refine_min_messages": 1,
    }
    options.update(extra)
    settings = Settings.load(environ={}, data_dir=data_dir, database_url=database_url, **options)
    return helpers.service(db, settings, helpers.RecordingQueue())


@pytest.fixture
def service(db: database.Database, data_dir: Path, database_url: str) -> Service:
    return service_for(db, data_dir, database_url)


@pytest.fixture
def client(service: Service) -> Iterator[TestClient]:
    with TestClient(api_app.create_app(service)) as c:
        yield c


def make_file(service: Service) -> str:
    """A flushed file whose first refinement has committed."""
    body = {
        "agent_id": "hermes",
        "session_key": "s1",
        "messages": [{"role": "user", "content": "I prefer green tea."}],
    }
    file_id: str = helpers.append(service, body).result.file_id
    service.flush(file_id)  # dispatches (min_messages 1): the first, ordinary refinement
    run_claims(service)
    return file_id


def run_claims(service: Service) -> int:
    """Run every enqueued refinement job, as a worker would; how many committed."""
    queue = service.queue
    assert isinstance(queue, helpers.RecordingQueue)
    committed = 0
    while queue.claims:
        committed += service.refine_segment(queue.claims.pop(0), final=True)
    return committed


def full_refines(db: database.Database, file_id: str) -> tuple[Any, Any]:
    t = tables.full_refines.c
    with db.transaction() as conn:
        found = conn.execute(
            sa.select(t.requested_at, t.finished_at).where(t.file_id == file_id)
        ).one()
    return found[0], found[1]


def shift(db: database.Database, file_id: str, seconds: float) -> None:
    """Move the recorded re-refine ``seconds`` into the past."""
    requested_at, finished_at = full_refines(db, file_id)
    delta = dt.timedelta(seconds=seconds)
    with db.transaction() as conn:
        conn.execute(
            sa.update(tables.full_refines)
            .where(tables.full_refines.c.file_id == file_id)
            .values(
                requested_at=requested_at - delta,
                finished_at=None if finished_at is None else finished_at - delta,
            )
        )


def throttled(r: Any) -> tuple[str, int]:
    """A 429 problem document: its detail and Retry-After."""
    assert r.status_code == 429, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert body["type"] == "urn:sgme:problem:too-many-requests"
    return body["detail"], int(r.headers["retry-after"])


def test_refused_while_running_and_for_the_cooldown_after(
    service: Service, client: TestClient
) -> None:
    file_id = make_file(service)
    first = client.post(f"/v1/files/{file_id}/refine")
    assert first.status_code == 202, first.text
    assert first.json()["last_refined_seq"] == 0

    # running: claimed, not committed
    detail, retry_after = throttled(client.post(f"/v1/files/{file_id}/refine"))
    assert "still running" in detail and file_id in detail
    assert retry_after == COOLDOWN
    assert full_refines(service.db, file_id)[1] is None

    assert run_claims(service) == 1
    requested_at, finished_at = full_refines(service.db, file_id)
    assert finished_at is not None and finished_at >= requested_at

    # finished just now: the cooldown counts from the end of the run
    detail, retry_after = throttled(client.post(f"/v1/files/{file_id}/refine"))
    assert "fully re-refined" in detail and "refine_cooldown_seconds" in detail
    assert COOLDOWN - 5 <= retry_after <= COOLDOWN

    shift(service.db, file_id, COOLDOWN - 60)
    _, retry_after = throttled(client.post(f"/v1/files/{file_id}/refine"))
    assert 55 <= retry_after <= 60

    shift(service.db, file_id, 61)
    again = client.post(f"/v1/files/{file_id}/refine")
    assert again.status_code == 202, again.text
    throttled(client.post(f"/v1/files/{file_id}/refine"))


def test_two_api_processes_share_the_cooldown(
    db: database.Database, data_dir: Path, database_url: str, service: Service, client: TestClient
) -> None:
    file_id = make_file(service)
    other = service_for(db, data_dir, database_url)
    with TestClient(api_app.create_app(other)) as second:
        assert client.post(f"/v1/files/{file_id}/refine").status_code == 202
        throttled(second.post(f"/v1/files/{file_id}/refine"))


def test_a_failed_run_is_not_running_its_cooldown_counts_from_the_request(
    service: Service, client: TestClient
) -> None:
    file_id = make_file(service)
    assert client.post(f"/v1/files/{file_id}/refine").status_code == 202
    queue = service.queue
    assert isinstance(queue, helpers.RecordingQueue)
    (claim,) = queue.claims
    queue.claims.clear()
    assert refine.fail(service.db, claim, "the model is down")
    _, retry_after = throttled(client.post(f"/v1/files/{file_id}/refine"))
    assert COOLDOWN - 5 <= retry_after <= COOLDOWN  # from the request, not "still running"
    shift(service.db, file_id, COOLDOWN + 1)
    r = client.post(f"/v1/files/{file_id}/refine")
    assert r.status_code == 202, r.text
    assert r.json()["status"] == "new"  # an error file is reset by a full re-refine


def test_an_archived_file_is_not_held_forever(service: Service, client: TestClient) -> None:
    file_id = make_file(service)
    assert client.post(f"/v1/files/{file_id}/refine").status_code == 202
    set_row(service.db, file_id, status="archived")  # archived files are not refined
    _, retry_after = throttled(client.post(f"/v1/files/{file_id}/refine"))
    assert retry_after <= COOLDOWN
    shift(service.db, file_id, COOLDOWN + 1)
    assert client.post(f"/v1/files/{file_id}/refine").status_code == 202


def test_no_cooldown_when_it_is_zero_and_none_for_the_cli(
    db: database.Database, data_dir: Path, database_url: str
) -> None:
    service = service_for(db, data_dir, database_url, refine_cooldown_seconds=0)
    file_id = make_file(service)
    with TestClient(api_app.create_app(service)) as client:
        for _ in range(3):
            assert client.post(f"/v1/files/{file_id}/refine").status_code == 202
    # the operator's `sgme refine --full` runs through request_full without a cooldown
    for _ in range(2):
        service.refine_now(file_id, full=True)
    assert full_refines(db, file_id)[1] is not None
    with pytest.raises(errors.Throttled) as caught:
        refine.request_full(db, file_id, cooldown=COOLDOWN)
    assert caught.value.retry_after is not None and caught.value.retry_after > COOLDOWN - 5


def test_the_cooldown_needs_the_refine_scope_first(service: Service, client: TestClient) -> None:
    """A token without ``refine`` is refused before the cooldown is looked at (403, not 429),
    and another agent's file is a 404 whatever its cooldown."""
    file_id = make_file(service)
    db = service.db
    refiner = auth.create(db, agent_ids=["hermes"], scopes=["refine"]).secret
    reader = auth.create(db, agent_ids=["hermes"], scopes=["read"]).secret
    stranger = auth.create(db, agent_ids=["other"], scopes=["refine"]).secret
    path = f"/v1/files/{file_id}/refine"
    assert client.post(path, headers={"Authorization": f"Bearer {refiner}"}).status_code == 202
    r = client.post(path, headers={"Authorization": f"Bearer {reader}"})
    assert r.status_code == 403, r.text
    r = client.post(path, headers={"Authorization": f"Bearer {stranger}"})
    assert r.status_code == 404, r.text
    throttled(client.post(path, headers={"Authorization": f"Bearer {refiner}"}))
