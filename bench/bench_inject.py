"""Memory injected by the UserPromptSubmit hook (issue 45), measured against a running
``sgme serve`` on bench/recall_set.py's evaluation set.

Each conversation of the set is one agent's memory (``agent_id`` ``conv{c}``), its sessions
recorded in one project directory (``cwd`` ``/projects/conv{c}``); each question is the
prompt a user submits in that project, in a new session. For every question:

* **search top 10** — whether one of its evidence turns is among the first 10 hits of
  ``GET /v1/search`` (the agent's own, ``limit=10``), as bench/bench_recall.py counts;
* **injected** — whether the block the hook injects (the default settings, or
  ``--min-score``) holds one of its evidence turns' refs, and the block's size.

Then the hook itself, as Claude Code runs it: ``sgme capture claude-code`` with the hook's
JSON on stdin, one process per prompt (``--hook-runs`` of them, questions spread over the
set), wall time p50/p95 from the process's start to its end — capture included (a session
that has no transcript yet: nothing to capture). Targets: p95 ≤ 1 s, and the evidence in the
block for at least 0.8 of the questions whose evidence is in the search's top 10.

Off-topic prompts (coding chores that share no fact with any conversation) show what the
relevance floor lets through: the share of them that get a block, per floor.

    .venv/bin/python bench/bench_inject.py [--hook-runs 200] [--questions N]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import recall_set  # noqa: E402
from bench_capture import server  # noqa: E402  (the same sgme serve, started and stopped alike)

from pipeline.capture import config, inject  # noqa: E402

SGME = Path(sys.executable).with_name("sgme")
FLOORS = (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0)
#: prompts a user types in a coding session that no conversation of the set has an answer to
OFF_TOPIC = [
    "Run the linter and fix what it finds.",
    "Rename the parse function to read_config everywhere.",
    "Why does the CI job fail on the second step?",
    "Add a unit test for the empty list case.",
    "Bump the version to 2.3.1 and update the changelog.",
    "Explain what this regular expression matches.",
    "Make the HTTP client retry on 503 with backoff.",
    "Split this module into two files along the storage seam.",
    "Where is the database connection pool configured?",
    "Write a docstring for every public function in utils.py.",
    "Convert the YAML settings loader to use dataclasses.",
    "The Docker image is too large; shrink it.",
    "Profile the import time of the command line tool.",
    "Replace print statements with logging calls.",
    "Check that the migration is reversible.",
    "ok thanks",
    "continue",
    "yes, go ahead",
    "commit this with a good message",
    "what changed since yesterday in the repo?",
]


def load(client: httpx.Client, conversations: list[recall_set.Conversation]) -> dict[str, Any]:
    """Every conversation appended as its agent's sessions, flushed; where each turn is."""
    where: dict[str, tuple[int, int, int]] = {}
    for c, conversation in enumerate(conversations):
        for s, (turns, date) in enumerate(
            zip(conversation.sessions, conversation.dates, strict=True)
        ):
            start = dt.datetime.combine(date, dt.time(18, 0), tzinfo=dt.UTC)
            body = {
                "agent_id": f"conv{c}",
                "session_key": f"s{s}",
                "metadata": {"cwd": f"/projects/conv{c}", "title": f"conversation {c} day {s}"},
                "messages": [
                    {
                        "role": turn.role,
                        "content": turn.text,
                        "ts": (start + dt.timedelta(minutes=i)).strftime("%Y-%m-%dT%H:%M:%SZ"),
                    }
                    for i, turn in enumerate(turns)
                ],
            }
            answer = client.post("/v1/append", params={"wait": "flushed"}, json=body)
            answer.raise_for_status()
            file_id = answer.json()["file_id"]
            for i in range(len(turns)):
                where[f"{file_id}:{i + 1}"] = (c, s, i)
    return where


def evidence_refs(
    question: recall_set.Question, where: dict[str, tuple[int, int, int]]
) -> set[str]:
    wanted = {(question.conversation, s, i) for s, i in question.evidence}
    return {ref for ref, key in where.items() if key in wanted}


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hook-runs", type=int, default=200, help="hook processes timed")
    parser.add_argument("--questions", type=int, default=0, help="questions used (0: all)")
    args = parser.parse_args()
    conversations, questions = recall_set.build()
    if args.questions:
        questions = questions[:: max(1, len(questions) // args.questions)][: args.questions]
    defaults = config.Injection()
    with tempfile.TemporaryDirectory(prefix="sgme-inject-") as tmp, server(Path(tmp)) as url:
        with httpx.Client(base_url=url, timeout=60) as client:
            started = time.monotonic()
            where = load(client, conversations)
            print(
                f"{len(conversations)} conversations, {len(where)} turns loaded in "
                f"{time.monotonic() - started:.1f} s; {len(questions)} questions; "
                f"defaults: {defaults.chars} chars, {defaults.hits} hits, "
                f"floor {defaults.min_score}, {defaults.seconds} s"
            )
            top10: list[bool] = []
            for q in questions:
                hits = client.get(
                    "/v1/search",
                    params={"q": q.text, "agent_id": f"conv{q.conversation}", "limit": 10},
                ).json()["hits"]
                top10.append(bool({h["source_ref"] for h in hits} & evidence_refs(q, where)))
        # the block for every question, in this process over HTTP (the hook's own code),
        # per floor
        spool = Path(tmp) / "spool"
        print()
        print(
            "| floor | evidence injected (all) | of those in search top 10 | mean block chars "
            "| blocks | off-topic prompts with a block |"
        )
        print("|---:|---:|---:|---:|---:|---:|")
        chosen: dict[str, float] = {}
        for floor in FLOORS:
            settings = config.Injection(min_score=floor)
            found, sizes = [], []
            for q in questions:
                agent = config.agent(
                    "claude-code",
                    {
                        "SGME_URL": url,
                        "SGME_SPOOL_DIR": str(spool),
                        "SGME_AGENT_ID": f"conv{q.conversation}",
                    },
                )
                call = inject.Call(
                    "UserPromptSubmit", None, f"/projects/conv{q.conversation}", q.text
                )
                got = inject.inject(agent, settings, call, deadline=time.monotonic() + 5.0)
                found.append(bool(set(got.refs) & evidence_refs(q, where)))
                if got.block:
                    sizes.append(len(got.block))
            noisy = 0
            for c, prompt in enumerate(OFF_TOPIC):
                agent = config.agent(
                    "claude-code",
                    {
                        "SGME_URL": url,
                        "SGME_SPOOL_DIR": str(spool),
                        "SGME_AGENT_ID": f"conv{c % len(conversations)}",
                    },
                )
                call = inject.Call("UserPromptSubmit", None, "/projects/x", prompt)
                got = inject.inject(agent, settings, call, deadline=time.monotonic() + 5.0)
                noisy += bool(got.block)
            share = sum(found) / len(found)
            in_top = [f for f, t in zip(found, top10, strict=True) if t]
            of_top = sum(in_top) / len(in_top) if in_top else 0.0
            mean = statistics.mean(sizes) if sizes else 0.0
            print(
                f"| {floor:g} | {share:.3f} | {of_top:.3f} ({len(in_top)} questions) | "
                f"{mean:.0f} | {len(sizes)} | {noisy}/{len(OFF_TOPIC)} |"
            )
            if floor == defaults.min_score:
                chosen = {"share": share, "of_top": of_top, "mean": mean}
        # the hook as Claude Code runs it: one process per prompt
        step = max(1, len(questions) // max(1, args.hook_runs))
        timed = questions[::step][: args.hook_runs]
        walls: list[float] = []
        starts: list[float] = []
        printed = 0
        for n, q in enumerate(timed):
            payload = {
                "session_id": str(uuid.uuid4()),
                "transcript_path": str(Path(tmp) / "none" / f"{n}.jsonl"),
                "cwd": f"/projects/conv{q.conversation}",
                "hook_event_name": "UserPromptSubmit",
                "prompt": q.text,
            }
            env = {
                **{k: v for k, v in os.environ.items() if not k.startswith("SGME_")},
                "SGME_URL": url,
                "SGME_SPOOL_DIR": str(spool),
                "SGME_AGENT_ID": f"conv{q.conversation}",
            }
            begun = time.monotonic()
            done = subprocess.run(
                [str(SGME), "capture", "claude-code"],
                input=json.dumps(payload),
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            walls.append(time.monotonic() - begun)
            assert done.returncode == 0, done.stderr
            if done.stdout:
                printed += 1
                json.loads(done.stdout)  # one JSON object, nothing else
            if n % 4 == 0:  # a session's start, as often
                payload = {**payload, "hook_event_name": "SessionStart", "source": "startup"}
                begun = time.monotonic()
                subprocess.run(
                    [str(SGME), "capture", "claude-code"],
                    input=json.dumps(payload),
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                starts.append(time.monotonic() - begun)
    print()
    print(
        f"UserPromptSubmit hook, {len(walls)} processes: p50 {percentile(walls, 0.5):.3f} s, "
        f"p95 {percentile(walls, 0.95):.3f} s, max {max(walls):.3f} s; {printed} printed a block"
    )
    print(
        f"SessionStart hook, {len(starts)} processes: p50 {percentile(starts, 0.5):.3f} s, "
        f"p95 {percentile(starts, 0.95):.3f} s, max {max(starts):.3f} s"
    )
    print(
        f"default floor {defaults.min_score:g}: evidence injected for {chosen['share']:.3f} of "
        f"the questions, {chosen['of_top']:.3f} of those whose evidence is in search's top 10 "
        f"(target 0.8); mean block {chosen['mean']:.0f} characters"
    )


if __name__ == "__main__":
    main()
