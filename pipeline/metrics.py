"""Prometheus metrics: index-wide gauges computed at scrape time, and process-local
histograms of the work this process did (flushes, refinements)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from pipeline import anomalies, database, errors, ledger, overview, tables

FLUSH_SECONDS = Histogram(
    "sgme_flush_seconds",
    "Duration of one flush (lock to commit)",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
ACK_TO_FLUSH_SECONDS = Histogram(
    "sgme_ack_to_flush_seconds",
    "From an append's acknowledgement to its flush commit",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
REFINE_SECONDS = Histogram(
    "sgme_refine_segment_seconds",
    "Duration of one refine_segment job",
    buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300),
)


class IndexCollector(Collector):
    """Gauges read from the index at each scrape."""

    def __init__(self, db: database.Database, *, embedding_model: str | None = None) -> None:
        self.db = db
        self.embedding_model = embedding_model

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """Journal backlog, held appends, refinement lag, files by status, anomalies by
        kind."""
        try:
            with self.db.reading() as conn:
                rows, messages, size = ledger.journal_backlog(conn)
                held, _ = ledger.waiting_backlog(conn)
                lag_sum, lag_max = overview.refinement_lag(conn)
                statuses = overview.count_files_by_status(conn)
                kinds = anomalies.count_by_kind(conn)
                embedding_lag = None
                if self.embedding_model is not None:
                    from pipeline import vectors  # numpy: only where an embedder is set

                    embedding_lag = vectors.lag(conn, self.embedding_model)
        except errors.SgmeError:
            up = GaugeMetricFamily("sgme_index_up", "Whether the index answered the scrape")
            up.add_metric([], 0)
            yield up
            return
        up = GaugeMetricFamily("sgme_index_up", "Whether the index answered the scrape")
        up.add_metric([], 1)
        yield up
        backlog = GaugeMetricFamily(
            "sgme_journal_backlog_messages", "Acknowledged messages not yet in their files"
        )
        backlog.add_metric([], messages)
        yield backlog
        backlog_bytes = GaugeMetricFamily(
            "sgme_journal_backlog_bytes", "Bytes of acknowledged appends not yet in their files"
        )
        backlog_bytes.add_metric([], size)
        yield backlog_bytes
        backlog_rows = GaugeMetricFamily(
            "sgme_journal_backlog_appends", "Acknowledged appends not yet in their files"
        )
        backlog_rows.add_metric([], rows)
        yield backlog_rows
        waiting = GaugeMetricFamily(
            "sgme_waiting_appends",
            "Numbered appends held until their predecessor lands (or order_wait_seconds pass)",
        )
        waiting.add_metric([], held)
        yield waiting
        lag = GaugeMetricFamily(
            "sgme_refinement_lag_messages",
            "flushed_seq - last_refined_seq over files (sum and max)",
            labels=["agg"],
        )
        lag.add_metric(["sum"], lag_sum)
        lag.add_metric(["max"], lag_max)
        yield lag
        if embedding_lag is not None:
            behind = GaugeMetricFamily(
                "sgme_embedding_lag_messages",
                "Flushed messages without a vector of the configured embedder's model",
            )
            behind.add_metric([], embedding_lag)
            yield behind
        files = GaugeMetricFamily("sgme_files", "Files by status", labels=["status"])
        for status in tables.STATUSES:
            files.add_metric([status], statuses.get(status, 0))
        yield files
        by_kind = GaugeMetricFamily("sgme_anomalies", "Anomaly records by kind", labels=["kind"])
        for kind, count in sorted(kinds.items()):
            by_kind.add_metric([kind], count)
        yield by_kind


def render(db: database.Database, *, embedding_model: str | None = None) -> bytes:
    """The text exposition of this process's histograms and the index gauges (the embedding
    lag of ``embedding_model`` when one is configured)."""
    from prometheus_client import REGISTRY

    registry = CollectorRegistry()
    registry.register(IndexCollector(db, embedding_model=embedding_model))
    return generate_latest(REGISTRY) + generate_latest(registry)
