"""The HTTP API (FastAPI): decode → one :class:`pipeline.service.Service` call → problem+json.

``app.create_app`` builds it; ``models`` declares every answer (the client uses the same
models); the routers are ``appends``, ``files``, ``refinement`` and ``ops``.
"""
