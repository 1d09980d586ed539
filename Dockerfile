# SGME L0 — one image for every process (api, worker, beat, migrate).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
RUN useradd --create-home --uid 10001 sgme && mkdir -p /var/lib/sgme && chown sgme /var/lib/sgme

COPY pyproject.toml setup.py MANIFEST.in README.md ./
COPY pipeline ./pipeline
COPY workers ./workers
# setup.py ships the Hermes provider inside the package (for `sgme hermes install`)
COPY integrations/hermes/sgme ./integrations/hermes/sgme
COPY config ./config
RUN pip install . flower

USER sgme
ENV SGME_CONFIG=/app/config/production.yaml
EXPOSE 8765
CMD ["sgme", "api"]
