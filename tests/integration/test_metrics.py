"""Prometheus metrics (:mod:`pipeline.metrics`): the index's gauges as a scrape reads them."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from pipeline import anomalies, database, journal, metrics
from pipeline.tables import Kind


def _samples(db: database.Database) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.render(db).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_the_gauges_follow_the_index(db: database.Database, data_dir: Path) -> None:
    body = {"agent_id": "a", "session_key": "s", "messages": [{"role": "user", "content": "x"}]}
    file_id = journal.ingest(db, body).file_id
    found = _samples(db)
    assert found[("sgme_index_up", ())] == 1
    assert found[("sgme_journal_backlog_messages", ())] == 1
    assert found[("sgme_files", (("status", "pending"),))] == 1
    journal.flush(db, data_dir, file_id)
    with db.transaction() as conn:
        anomalies.record(conn, file_id, Kind.FORMAT_ERROR, "d", now=db.now())
        anomalies.record(conn, file_id, Kind.FORMAT_ERROR, "d", now=db.now())
    found = _samples(db)
    assert found[("sgme_journal_backlog_messages", ())] == 0
    assert found[("sgme_files", (("status", "new"),))] == 1
    assert found[("sgme_refinement_lag_messages", (("agg", "max"),))] == 1
    assert found[("sgme_anomalies", (("kind", "format_error"),))] == 2
