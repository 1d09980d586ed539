"""Removing on purpose (docs/design.md §13): redact a message, erase a file, see the audit trail,
and set an agent's secret-redaction policy. Every route needs an ``admin`` token, and acts only on
the agents that token holds."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from pipeline import refs, rewrite, validation
from pipeline.api import models
from pipeline.api.deps import FileIdPath, ServiceDep, problems
from pipeline.api.security import Admin

router = APIRouter(tags=["privacy"])
MAX_ID = 2**63 - 1


class RedactBody(BaseModel):
    """Body of ``POST /v1/refs/{ref}/redact``."""

    model_config = ConfigDict(extra="forbid", strict=True)
    reason: Annotated[
        str,
        validation.Text(
            min_length=1,
            max_length=rewrite.MAX_REASON,
            one_line=True,
            nonblank=True,
            description="why (one line): written into the tombstone and the audit trail",
            examples=["an API key pasted by mistake"],
        ),
    ]


class PolicyBody(BaseModel):
    """Body of ``PUT /v1/agents/{agent_id}/policy``."""

    model_config = ConfigDict(extra="forbid", strict=True)
    redact_secrets: bool | None = Field(
        description="false: the agent's appends are stored as sent (secrets included); true: "
        "redacted; null: follow the redact_secrets setting"
    )


@router.post(
    "/v1/refs/{ref}/redact",
    response_model=models.Redacted,
    responses=problems(404, 409, 410, 422, 503),
)
def redact_ref(
    ref: Annotated[str, Path(pattern=refs.SOURCE_REF_PATTERN, description="file_id:seq")],
    body: Annotated[RedactBody, Body()],
    service: ServiceDep,
    caller: Admin,
) -> dict[str, Any]:
    """Redact one message: its body becomes a tombstone naming when and why; its seq and
    every other message stay (every source_ref still resolves). The file is rewritten under
    its lock; the message's catalog and search rows and the L1 items citing it go, and the
    file is refined again from there; the audit trail records who, when, why and the sha256
    of the removed body. Redacting a redacted message changes nothing."""
    who = service.removals.who(caller.token_id, body.reason)
    (record,) = service.removals.redact([ref], who, agents=caller.agents)
    found = service.resolve(ref, context=0, agents=caller.agents)
    file_id = found.file.file_id
    return {
        "source_ref": ref,
        "file_id": file_id,
        "agent_id": found.file.agent_id,
        "session_key": found.file.session_key,
        "source_type": found.file.source_type,
        "message": found.message.to_json(file_id),
        "before": [],
        "after": [],
        "redaction": record.to_json(),
    }


@router.delete("/v1/files/{file_id}", status_code=204, responses=problems(404, 410, 422, 503))
def erase_file(
    file_id: FileIdPath,
    service: ServiceDep,
    caller: Admin,
    reason: Annotated[
        str,
        Query(
            max_length=rewrite.MAX_REASON,
            pattern=validation.ONE_LINE_PATTERN,
            description="why, one line (kept in the audit trail)",
        ),
    ] = "",
) -> Response:
    """Erase a file: its bytes (live and archived), its journal rows, waiting appends,
    catalog and search rows, L1 items and idempotency records go; the audit trail keeps who,
    when and why. Afterwards the file and its source_refs answer 410 Gone."""
    who = service.removals.who(caller.token_id, reason, required=False)
    service.removals.erase_file(file_id, who, agents=caller.agents)
    return Response(status_code=204)


@router.get("/v1/audit", response_model=models.AuditRecords, responses=problems(422, 503))
def audit_trail(
    service: ServiceDep,
    caller: Admin,
    file_id: Annotated[
        str | None, Query(pattern=refs.FILE_ID_PATTERN, json_schema_extra={"format": "uuid"})
    ] = None,
    after: Annotated[int, Query(ge=0, le=MAX_ID, description="records with id > after")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    """The audit trail of redactions and erasures, oldest first (the token's agents only)."""
    trail = service.removals.audit_trail
    rows = trail(agents=caller.agents, file_id=file_id, after=after, limit=limit)
    next_after = rows[-1].id if len(rows) == limit else None
    return {"records": [row.to_json() for row in rows], "next_after": next_after}


AgentPath = Annotated[str, Path(pattern=validation.AGENT_ID_PATTERN)]


@router.get(
    "/v1/agents/{agent_id}/policy", response_model=models.Policy, responses=problems(422, 503)
)
def get_policy(agent_id: AgentPath, service: ServiceDep, caller: Admin) -> dict[str, Any]:
    """Whether the agent's appends have their secrets redacted, and why (its own policy or
    the ``redact_secrets`` setting)."""
    caller.require_agent(agent_id)
    return service.policies.get(agent_id).to_json()


@router.put(
    "/v1/agents/{agent_id}/policy", response_model=models.Policy, responses=problems(422, 503)
)
def put_policy(
    agent_id: AgentPath, body: Annotated[PolicyBody, Body()], service: ServiceDep, caller: Admin
) -> dict[str, Any]:
    """Give the agent a policy of its own (``redact_secrets: false`` stores its appends as
    sent) or send it back to the setting (``null``). Other API processes apply it within
    ``token_cache_seconds``."""
    caller.require_agent(agent_id)
    who = service.removals.who(caller.token_id, "policy", required=False)
    return service.policies.set(agent_id, body.redact_secrets, actor=who.actor).to_json()
