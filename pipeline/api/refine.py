"""L1 items and full re-refines."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from pipeline import refs, validation
from pipeline.api import models
from pipeline.api.deps import FileIdPath, ServiceDep, problems
from pipeline.api.security import Reader, Refiner

router = APIRouter(tags=["refinement"])
MAX_ID = 2**63 - 1


@router.post(
    "/v1/files/{file_id}/refine",
    status_code=202,
    response_model=models.File | models.RefineRequested,
    responses=problems(404, 409, 410, 422, 429, 503),
)
def refine_file(file_id: FileIdPath, service: ServiceDep, caller: Refiner) -> dict[str, Any]:
    """Full re-refine: ``last_refined_seq = 0``; the file's L1 items are replaced when the new
    run commits. 429 with ``Retry-After`` while the file's last full re-refine is running or
    finished less than ``refine_cooldown_seconds`` ago. The answer is the file's row when the
    token may read it, else only that the re-refine was requested."""
    row = service.request_refine(file_id, agents=caller.agents)
    if "read" not in caller.scopes:
        return {"file_id": row.file_id, "refine": "requested"}
    return row.to_json()


@router.get("/v1/l1", response_model=models.L1Items, responses=problems(422, 503))
def list_l1(
    service: ServiceDep,
    caller: Reader,
    file_id: Annotated[
        str | None, Query(pattern=refs.FILE_ID_PATTERN, json_schema_extra={"format": "uuid"})
    ] = None,
    agent_id: Annotated[str | None, Query(pattern=validation.AGENT_ID_PATTERN)] = None,
    after: Annotated[int, Query(ge=0, le=MAX_ID, description="items with id > after")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    """L1 items, oldest first; each source_ref resolves through ``/v1/refs/…``. Only the
    token's agents' items are listed (an ``agent_id`` it does not hold lists none)."""
    items = service.l1_items(
        file_id=file_id, agents=caller.listing(agent_id), after=after, limit=limit
    )
    next_after = items[-1].id if len(items) == limit else None
    return {"items": [item.to_json() for item in items], "next_after": next_after}
