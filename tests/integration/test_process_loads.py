"""What a process of a store without an embedder loads (docs/design.md, "What a process
loads"): the semantic leg's numpy and httpx only where an embedder is set. numpy's import
makes every ``printf`` of the process take glibc's slow path (its libquadmath registers printf
handlers) and grows what the garbage collector walks; the append path pays both."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys
from pipeline import catalog, runtime, settings, validation
import pipeline.api.app, workers.app

conf = settings.Settings.load(environ={}, data_dir=sys.argv[1])
rt = runtime.Runtime.open(conf, migrate=True)
service = rt.service(None)
body = {"agent_id": "a", "session_key": "s", "messages": [{"role": "user", "content": "tea time"}]}
answer = service.append(validation.parse_append(body, conf.limits), wait=True)
found = service.search("tea", catalog.Filters(), limit=5)
service.metrics()
# a redaction and an erasure forget vectors too, in SQL alone
more = {**body, "session_key": "t", "messages": [{"role": "user", "content": "key 123"}]}
other = service.append(validation.parse_append(more, conf.limits), wait=True)
who = service.removals.who(None, "a test", required=True)
service.removals.redact([answer.result.source_refs[0]], who)
service.removals.erase_file(other.result.file_id, who)
left = service.search("tea", catalog.Filters(), limit=5)
rt.close()
print(json.dumps({
    "flushed": answer.flushed,
    "hits": len(found),
    "after": len(left),
    "loaded": sorted(m for m in ("numpy", "httpx") if m in sys.modules),
}))
"""


def test_a_store_without_an_embedder_never_loads_numpy_or_httpx(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "data")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen == {"flushed": True, "hits": 1, "after": 0, "loaded": []}
