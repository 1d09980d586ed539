"""Health and metrics."""

from __future__ import annotations

import os

from fastapi import APIRouter, Depends, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

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
    checks = {**service.health(), "process": os.getpid()}
    return JSONResponse(checks, status_code=200 if checks["status"] == "ok" else 503)


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}},
    dependencies=[Depends(metrics_caller)],
)
def prometheus(service: ServiceDep) -> Response:
    """Prometheus metrics: journal backlog, flush latency, refinement lag, anomalies."""
    return Response(service.metrics(), media_type=CONTENT_TYPE_LATEST)
