"""Health and metrics."""

from __future__ import annotations

import os
import uuid
from typing import Any

from fastapi import APIRouter, Depends, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from pipeline import database, errors, ledger, metrics, store
from pipeline.api import models
from pipeline.api.deps import ServiceDep
from pipeline.api.security import metrics_caller

router = APIRouter(tags=["operations"])


@router.get(
    "/v1/health",
    response_model=models.Health,
    responses={503: {"model": models.Health, "description": "degraded"}},
)
def health(service: ServiceDep) -> JSONResponse:
    """Whether the index answers and the data directory is writable."""
    checks: dict[str, Any] = {"journal_backlog": None, "process": os.getpid()}
    try:
        with database.transaction(service.engine) as conn:
            rows, messages, size = ledger.journal_backlog(conn)
        checks["index"] = "ok"
        checks["journal_backlog"] = {"rows": rows, "messages": messages, "bytes": size}
    except errors.SgmeError as exc:
        checks["index"] = exc.detail
    # A name of its own per probe: concurrent health checks must not trip over each other.
    probe = service.settings.data_dir / f".health-{uuid.uuid4().hex}"
    try:
        store.create(probe, b"ok")
        store.remove(probe, durable=False)
        checks["data_dir"] = "ok"
    except errors.SgmeError as exc:
        checks["data_dir"] = exc.detail
    ok = checks["index"] == "ok" and checks["data_dir"] == "ok"
    return JSONResponse(
        {"status": "ok" if ok else "degraded", **checks}, status_code=200 if ok else 503
    )


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}},
    dependencies=[Depends(metrics_caller)],
)
def prometheus(service: ServiceDep) -> Response:
    """Prometheus metrics: journal backlog, flush latency, refinement lag, anomalies."""
    return Response(metrics.render(service.engine), media_type=CONTENT_TYPE_LATEST)
