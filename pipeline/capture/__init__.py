"""Live capture: the agents' own hooks append each turn to SGME as it ends.

``sgme capture claude-code`` and ``sgme capture codex`` are run by the agents' hooks (Claude
Code's ``Stop``, ``SubagentStop``, ``PreCompact`` and ``SessionEnd``; Codex's ``Stop`` hook and
``notify`` program). Each run reads the transcript with the importer of the same name
(:mod:`pipeline.importers`: the same conversion, the same deterministic keys, so capture,
re-capture and a later ``sgme import`` never write a turn twice) and appends what it gained
since the last run through :mod:`pipeline.client`, over HTTP, to a running server (one writer,
any deployment).

A hook never harms its agent: a run exits 0 whatever happens, keeps to a time budget, and
what the server cannot take now waits in a spool (:mod:`.spool`) for a later run, in order.

Modules: :mod:`.hooks` (what each hook call asks for), :mod:`.runner` (one run),
:mod:`.state` (what earlier runs took), :mod:`.spool` (what waits), :mod:`.install` (merging
the hooks into the agents' settings). Kept light: ``sgme hermes install`` reads the spool's
file from this package.
"""
