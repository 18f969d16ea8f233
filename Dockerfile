# hermes-core gateway: python:3.11-slim, an unprivileged user, the SQLite data in a volume.
#
#   docker build -t hermes-core .
#   docker run -d --name hermes-core -p 127.0.0.1:8080:8080 --env-file /etc/hermes-core/hermes-core.env \
#       -v hermes-data:/var/lib/hermes-core hermes-core
#
# Secrets come from the environment only (--env-file); none is baked into the image. The image
# holds the three environment configurations (/etc/hermes-core/{dev,staging,prod}.yaml) and runs
# prod.yaml; pass another command to pick another one. See docs/deploy.md.

FROM python:3.11-slim AS build
# the extras installed: feishu; deploy/compose/ adds temporal (engine: temporal, docs/scale-out.md)
ARG EXTRAS=feishu
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY src ./src
RUN python -m venv /opt/hermes-core \
    && /opt/hermes-core/bin/pip install --constraint constraints.txt ".[${EXTRAS}]"

FROM python:3.11-slim
LABEL org.opencontainers.image.title="hermes-core" \
      org.opencontainers.image.description="A small Hermes-style agent gateway: webhook and Feishu channels"
ENV PATH=/opt/hermes-core/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HERMES_LOG_LEVEL=INFO
RUN groupadd --system --gid 10001 hermes \
    && useradd --system --uid 10001 --gid hermes --home-dir /var/lib/hermes-core --shell /usr/sbin/nologin hermes \
    && mkdir -p /var/lib/hermes-core \
    && chown hermes:hermes /var/lib/hermes-core
COPY --from=build /opt/hermes-core /opt/hermes-core
COPY deploy/config/ /etc/hermes-core/
COPY deploy/skills/ /etc/hermes-core/skills/
WORKDIR /var/lib/hermes-core
USER 10001:10001
VOLUME ["/var/lib/hermes-core"]
EXPOSE 8080
# /healthz answers 200 while the gateway accepts messages, 503 while it stops; no curl needed.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]
CMD ["hermes-core", "--config", "/etc/hermes-core/prod.yaml", "serve", "--host", "0.0.0.0"]
