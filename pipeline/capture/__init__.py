"""Live capture: the agents' own hooks append each turn to SGME as it ends.

``sgme capture claude-code`` and ``sgme capture codex`` are run by the agents' hooks (Claude
Code's ``Stop``, ``SubagentStop``, ``PreCompact`` and ``SessionEnd``; Codex's ``Stop`` hook and
``notify`` program). Each run reads what the transcript gained since the last run with the
importer of the same name (:mod:`pipeline.importers`: the same conversion, the same keys — a
record's, an item's — so capture, re-capture and a later ``sgme import`` make the same memory
and never write a unit twice) and appends it over HTTP (httpx; refusals read by
:mod:`pipeline.exchange`, as the client reads them) to a running server (one writer, any
deployment). Nothing of the server is imported on a hook's path.

A hook never harms its agent: a run exits 0 whatever happens, keeps to a time budget, says in
its log why it could not deliver, and what the server cannot take now waits in a spool
(:mod:`.spool`: one file a run, redacted) for a later run, in order.

Modules: :mod:`.hooks` (what each hook call asks for), :mod:`.runner` (one run),
:mod:`.state` (how far each transcript was read; each agent's last delivery and error),
:mod:`.spool` (what waits), :mod:`.install` (merging the hooks into the agents' settings),
:mod:`.config` (the environment and the token file). Kept light: ``sgme hermes install``
reads the spool's file from this package.
"""
